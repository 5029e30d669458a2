/**
 * Parameters written into SQL text as literals, so that a transaction's statements go to the
 * server in one call: each value becomes a literal of its own (a placeholder never leaks into
 * another), and a value without a literal makes the statement fall back to parameters.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Dialect from "../src/internal/dialect.js"

const table: Dialect.Table = { schema: undefined, table: "lockstep_locks" }
const pg = Dialect.make("pg", table)
const mysql = Dialect.make("mysql", table)
const sqlite = Dialect.make("sqlite", table)

describe("literals", () => {
  it("PostgreSQL: dollar-quoted strings, with a tag the text does not close early", () => {
    assert.strictEqual(Dialect.postgresLiteral("plain"), " $l$plain$l$")
    assert.strictEqual(Dialect.postgresLiteral("it's \\ $1 ?"), " $l$it's \\ $1 ?$l$")
    // the text holds the tag, or ends with what the closing tag would complete
    assert.strictEqual(Dialect.postgresLiteral("a$l$b"), " $l1$a$l$b$l1$")
    assert.strictEqual(Dialect.postgresLiteral("a$l"), " $l1$a$l$l1$")
    assert.strictEqual(Dialect.postgresLiteral("$l1$$l$"), " $l2$$l1$$l$$l2$")
    assert.strictEqual(Dialect.postgresLiteral(""), " $l$$l$")
    assert.strictEqual(Dialect.postgresLiteral(["a", "b'"]), "ARRAY[ $l$a$l$,  $l$b'$l$]::text[]")
    assert.strictEqual(Dialect.postgresLiteral([]), "ARRAY[]::text[]")
    assert.strictEqual(Dialect.postgresLiteral(-1.5e21), "-1.5e+21")
  })

  it("PostgreSQL: NUL, non-finite numbers and other values have no literal", () => {
    assert.isUndefined(Dialect.postgresLiteral("a\u0000b"))
    assert.isUndefined(Dialect.postgresLiteral(["a", "\u0000"]))
    assert.isUndefined(Dialect.postgresLiteral(Number.NaN))
    assert.isUndefined(Dialect.postgresLiteral(Infinity))
    assert.isUndefined(Dialect.postgresLiteral(null))
    assert.isUndefined(Dialect.postgresLiteral([1]))
  })

  it("MySQL: text as UTF-8 hex with the utf8mb4 introducer, so that no escaping is involved", () => {
    assert.strictEqual(Dialect.mysqlLiteral("a'\\"), "_utf8mb4 X'61275c'")
    assert.strictEqual(Dialect.mysqlLiteral(""), "_utf8mb4 X''")
    assert.strictEqual(Dialect.mysqlLiteral("🔒\u0000"), "_utf8mb4 X'f09f949200'")
    assert.strictEqual(Dialect.mysqlLiteral(42), "42")
    assert.isUndefined(Dialect.mysqlLiteral(Number.NEGATIVE_INFINITY))
    assert.isUndefined(Dialect.mysqlLiteral(["a"]))
  })
})

describe("inline", () => {
  it("PostgreSQL: $n is the nth parameter, $10 included", () => {
    const params = Array.from({ length: 11 }, (_, i) => `p${i + 1}`)
    const sql = pg.inline({ sql: "SELECT $1, $10, $11, $2", params })
    assert.strictEqual(sql, "SELECT  $l$p1$l$,  $l$p10$l$,  $l$p11$l$,  $l$p2$l$")
  })

  it("MySQL: each ? is the next parameter, and a literal's own text is never read as one", () => {
    assert.strictEqual(mysql.inline({ sql: "SELECT ?, ?", params: ["?", 1] }), "SELECT _utf8mb4 X'3f', 1")
  })

  it("a statement with a value without a literal, or short of parameters, is not inlined", () => {
    assert.isUndefined(pg.inline({ sql: "SELECT $1", params: ["\u0000"] }))
    assert.isUndefined(pg.inline({ sql: "SELECT $2", params: ["a"] }))
    assert.isUndefined(mysql.inline({ sql: "SELECT ?, ?", params: ["a"] }))
    // SQLite is in process: its statements go one by one, with parameters
    assert.isUndefined(sqlite.inline({ sql: "SELECT ?", params: ["a"] }))
  })

  it("every statement of a transaction has its literals: lock, ended holders, writes", () => {
    for (const dialect of [pg, mysql]) {
      const statements = [
        ...dialect.lockRows(["k'1", "k2"]),
        dialect.readEnded("k'1", ["c:1", "!c:1"]),
        ...dialect.write(
          [{ name: "k'1", state: "{\"f\":1}", expiresAt: 1_700_000_000_000.5, version: 3 }],
          dialect.name === "pg" ? ["l:k'1"] : [],
          { name: "k'1", ended: [["c:1", 1_700_000_010_000]] }
        )
      ]
      for (const statement of statements) {
        const text = dialect.inline(statement)
        assert.isDefined(text, statement.sql)
        assert.notMatch(text!, dialect.name === "pg" ? /\$\d/ : /\?/, "no placeholder left")
      }
    }
  })
})
