import { assert, describe, it } from "@effect/vitest"
import { existsSync, mkdtempSync, mkdirSync, rmSync, symlinkSync } from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Either } from "effect"
import * as ZooKeeperServer from "@lockstep/servers/ZooKeeperServer"
import type { Host } from "../src/internal/zooKeeperInstallation.js"
import { DEBIAN_JAR, find, findClasspath, findJava } from "../src/internal/zooKeeperInstallation.js"

/** A host with these variables and these files (a directory is listed by the paths under it). */
const hostWith = (env: Readonly<Record<string, string>>, files: ReadonlyArray<string>): Host => ({
  env,
  exists: (file) => files.some((known) => known === file || known.startsWith(`${file}/`)),
  list: (dir) => [
    ...new Set(
      files.filter((file) => file.startsWith(`${dir}/`)).map((file) => file.slice(dir.length + 1).split("/")[0]!)
    )
  ],
  delimiter: ":"
})

const DEBIAN = [DEBIAN_JAR, "/etc/zookeeper/conf/zoo.cfg", "/usr/share/java/slf4j-simple.jar"]
const RELEASE = [
  "/opt/zk/lib/zookeeper-3.8.4.jar",
  "/opt/zk/lib/slf4j-api-1.7.30.jar",
  "/opt/zk/lib/zookeeper-jute-3.8.4.jar",
  "/opt/zk/conf/logback.xml",
  "/opt/zk/bin/zkServer.sh"
]

const classpathOf = (result: Either.Either<{ readonly classpath: ReadonlyArray<string>; readonly source: string }, string>) =>
  Either.match(result, {
    onLeft: (message) => assert.fail(`no classpath: ${message}`),
    onRight: (found) => found
  })

const messageOf = (result: Either.Either<unknown, string>): string =>
  Either.match(result, { onLeft: (message) => message, onRight: () => assert.fail("a classpath was found") })

describe("ZooKeeperServer installation lookup", () => {
  it("Debian's package is the last resort: its jar, its conf dir and slf4j-simple (for the log)", () => {
    const found = classpathOf(findClasspath({}, hostWith({}, DEBIAN)))
    assert.deepStrictEqual(found.classpath, [DEBIAN_JAR, "/etc/zookeeper/conf", "/usr/share/java/slf4j-simple.jar"])
    assert.strictEqual(found.source, "Debian's zookeeper package")
    const silent = classpathOf(findClasspath({}, hostWith({}, [DEBIAN_JAR])))
    assert.deepStrictEqual(silent.classpath, [DEBIAN_JAR, "/etc/zookeeper/conf"])
  })

  it("nothing found: the message says what was looked for and which variable to set", () => {
    const message = messageOf(findClasspath({}, hostWith({}, [])))
    for (const looked of ["classpath option", "ZOOKEEPER_CLASSPATH", "ZOOKEEPER_HOME", DEBIAN_JAR]) {
      assert.include(message, looked)
    }
    assert.match(message, /set ZOOKEEPER_HOME to an unpacked Apache ZooKeeper binary release/)
  })

  it("ZOOKEEPER_HOME comes before Debian's package: the release's jars (top, then lib/), then conf/", () => {
    const found = classpathOf(findClasspath({}, hostWith({ ZOOKEEPER_HOME: "/opt/zk" }, [...DEBIAN, ...RELEASE])))
    assert.deepStrictEqual(found.classpath, [
      "/opt/zk/lib/slf4j-api-1.7.30.jar",
      "/opt/zk/lib/zookeeper-3.8.4.jar",
      "/opt/zk/lib/zookeeper-jute-3.8.4.jar",
      "/opt/zk/conf"
    ])
    assert.strictEqual(found.source, "ZOOKEEPER_HOME=/opt/zk")
    // an older release keeps the server jar at its top; no conf/ is no conf entry
    const older = classpathOf(findClasspath(
      {},
      hostWith({ ZOOKEEPER_HOME: "/opt/zk" }, ["/opt/zk/zookeeper-3.4.14.jar", "/opt/zk/lib/netty-3.10.6.jar"])
    ))
    assert.deepStrictEqual(older.classpath, ["/opt/zk/zookeeper-3.4.14.jar", "/opt/zk/lib/netty-3.10.6.jar"])
  })

  it("a ZOOKEEPER_HOME without a server jar is reported, not passed over for Debian's package", () => {
    const message = messageOf(findClasspath(
      {},
      hostWith({ ZOOKEEPER_HOME: "/opt/zk" }, [...DEBIAN, "/opt/zk/lib/zookeeper-jute-3.8.4.jar"])
    ))
    assert.include(message, "ZOOKEEPER_HOME=/opt/zk")
    assert.include(message, "/opt/zk/lib")
    assert.include(message, "zookeeper-<version>.jar")
  })

  it("ZOOKEEPER_CLASSPATH comes before ZOOKEEPER_HOME; every entry must exist (a dir/* entry: its dir)", () => {
    const env = { ZOOKEEPER_CLASSPATH: "/srv/zk/zookeeper.jar:/srv/zk/deps/*:", ZOOKEEPER_HOME: "/opt/zk" }
    const found = classpathOf(findClasspath({}, hostWith(env, [...RELEASE, "/srv/zk/zookeeper.jar", "/srv/zk/deps/a.jar"])))
    assert.deepStrictEqual(found.classpath, ["/srv/zk/zookeeper.jar", "/srv/zk/deps/*"])
    assert.strictEqual(found.source, "ZOOKEEPER_CLASSPATH")
    const message = messageOf(findClasspath({}, hostWith(env, [...RELEASE, "/srv/zk/zookeeper.jar"])))
    assert.include(message, "ZOOKEEPER_CLASSPATH")
    assert.include(message, "/srv/zk/deps/*")
    assert.notInclude(message, "/srv/zk/zookeeper.jar")
  })

  it("the classpath option comes before every variable; an empty one is refused", () => {
    const env = { ZOOKEEPER_CLASSPATH: "/srv/zk/zookeeper.jar", ZOOKEEPER_HOME: "/opt/zk" }
    const files = [...DEBIAN, ...RELEASE, "/srv/zk/zookeeper.jar", "/mine/zookeeper.jar"]
    const found = classpathOf(findClasspath({ classpath: ["/mine/zookeeper.jar"] }, hostWith(env, files)))
    assert.deepStrictEqual(found.classpath, ["/mine/zookeeper.jar"])
    assert.strictEqual(found.source, "the classpath option")
    assert.include(messageOf(findClasspath({ classpath: ["/nowhere.jar"] }, hostWith(env, files))), "/nowhere.jar")
    assert.include(messageOf(findClasspath({ classpath: [] }, hostWith(env, files))), "empty")
  })

  it("an empty variable counts as unset", () => {
    const found = classpathOf(findClasspath({}, hostWith({ ZOOKEEPER_CLASSPATH: "", ZOOKEEPER_HOME: "" }, DEBIAN)))
    assert.strictEqual(found.source, "Debian's zookeeper package")
    assert.strictEqual(findJava({}, hostWith({ JAVA: "", JAVA_HOME: "" }, [])), "java")
  })

  it("java: the option, else JAVA, else JAVA_HOME's bin/java, else java on PATH", () => {
    const env = { JAVA: "/opt/jdk-21/bin/java", JAVA_HOME: "/usr/lib/jvm/java-17" }
    assert.strictEqual(findJava({ java: "/my/java" }, hostWith(env, [])), "/my/java")
    assert.strictEqual(findJava({}, hostWith(env, [])), "/opt/jdk-21/bin/java")
    assert.strictEqual(findJava({}, hostWith({ JAVA_HOME: "/usr/lib/jvm/java-17" }, [])), "/usr/lib/jvm/java-17/bin/java")
    assert.strictEqual(findJava({}, hostWith({}, [])), "java")
  })

  it("find: the classpath with its java, or why there is none", () => {
    const found = find({ java: "/my/java" }, hostWith({}, DEBIAN))
    assert.isTrue(Either.isRight(found) && found.right.java === "/my/java" && found.right.classpath[0] === DEBIAN_JAR)
    assert.isTrue(Either.isLeft(find({ java: "/my/java" }, hostWith({}, []))))
  })

  it.effect("installation: a wrong choice fails with a typed ZooKeeperServerError that names it", () =>
    Effect.gen(function*() {
      const missing = yield* Effect.either(ZooKeeperServer.installation({ classpath: ["/nonexistent/zookeeper.jar"] }))
      assert.isTrue(Either.isLeft(missing))
      if (Either.isLeft(missing)) {
        assert.instanceOf(missing.left, ZooKeeperServer.ZooKeeperServerError)
        assert.match(missing.left.message, /classpath option names what does not exist: \/nonexistent\/zookeeper\.jar/)
      }
      const given = yield* ZooKeeperServer.installation({ java: "/my/java", classpath: [os.tmpdir()] })
      assert.deepStrictEqual(given, { java: "/my/java", classpath: [os.tmpdir()], source: "the classpath option" })
    }))
})

// an Apache-style release (lib/ with the server jar and a logging binding) made of Debian's jars,
// whose manifest names the rest of the classpath by absolute paths
const required = process.env["LOCKSTEP_REQUIRE_ZOOKEEPER"] === "1"
const debian = existsSync(DEBIAN_JAR)

describe.skipIf(!debian && !required)("ZooKeeperServer from ZOOKEEPER_HOME", () => {
  it.scopedLive("a server runs from a release laid out as Apache's tarball, found by ZOOKEEPER_HOME", () =>
    Effect.gen(function*() {
      assert.isTrue(debian, `${DEBIAN_JAR} not found and LOCKSTEP_REQUIRE_ZOOKEEPER=1 requires it`)
      const home = yield* Effect.acquireRelease(
        Effect.sync(() => mkdtempSync(path.join(os.tmpdir(), "lockstep-zookeeper-home-"))),
        (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
      )
      mkdirSync(path.join(home, "lib"))
      symlinkSync(DEBIAN_JAR, path.join(home, "lib", "zookeeper-3.8.0.jar"))
      if (existsSync("/usr/share/java/slf4j-simple.jar")) {
        symlinkSync("/usr/share/java/slf4j-simple.jar", path.join(home, "lib", "slf4j-simple.jar"))
      }
      const before = process.env["ZOOKEEPER_HOME"]
      yield* Effect.acquireRelease(
        Effect.sync(() => {
          process.env["ZOOKEEPER_HOME"] = home
        }),
        () =>
          Effect.sync(() => {
            if (before === undefined) delete process.env["ZOOKEEPER_HOME"]
            else process.env["ZOOKEEPER_HOME"] = before
          })
      )
      const found = yield* ZooKeeperServer.installation()
      assert.strictEqual(found.source, `ZOOKEEPER_HOME=${home}`)
      assert.include(found.classpath, path.join(home, "lib", "zookeeper-3.8.0.jar"))
      assert.isTrue(yield* ZooKeeperServer.available)
      const server = yield* ZooKeeperServer.make()
      assert.strictEqual(yield* server.mode, "standalone")
    }))

  it.scopedLive("the java and classpath options run a server from what they name", () =>
    Effect.gen(function*() {
      const found = yield* ZooKeeperServer.installation()
      const server = yield* ZooKeeperServer.make({ java: found.java, classpath: found.classpath })
      assert.strictEqual(yield* server.mode, "standalone")
    }))
})
