#!/usr/bin/env bash
# Checks the packages as they are published, run by .ci/run:
# 1. builds every package and packs it with pnpm (which puts publishConfig's exports, types and
#    typesVersions in place and turns workspace: ranges into real versions), and checks the packed
#    manifests and file lists;
# 2. runs publint and @arethetypeswrong/cli (all resolution modes, node10 included) on every tarball;
# 3. installs the tarballs with npm into a new project outside the workspace, with effect,
#    @effect/sql, @effect/sql-pg and ioredis 6, then ioredis 5, and for each: installs one more
#    package as an application later does (ioredis 6: the way the README's Install section tells
#    users, since a plain `npm install` there fails with ERESOLVE), then runs an ES module and a CommonJS
#    program with plain node (locks on the memory backend, on a real redis-server they start and on
#    the machine's PostgreSQL in a database of the check's own), and type-checks a
#    TypeScript consumer (strict, skipLibCheck off, types: []) under module/moduleResolution node16
#    (as a CommonJS .ts and an ES module .mts) and esnext/bundler. Once, it also type-checks every
#    public entry point but those on ioredis (@lockstep/redis, @lockstep/testkit/RedisMock) without
#    Node's types in the program, to show our declarations need none.
# 4. installs @lockstep/cli from its tarball into a project of its own and runs its `lockstep` bin:
#    `npx lockstep --help`, and `lockstep run` with plain node against a real redis-server; then
#    installs it globally from its tarball alone (scripts/consumer/cli-global.sh);
# 5. runs the README's Install block verbatim in a new project that first installed effect
#    unpinned, and checks lockstep's refusal of Effect 4.
# Any failure fails the check. LOCKSTEP_KEEP_CONSUMER=1 keeps the temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PNPM="npx -y pnpm@10.34.9"
WORK=$(mktemp -d)
if [ "${LOCKSTEP_KEEP_CONSUMER:-}" = 1 ]; then echo "working in $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi

$PNPM build
mkdir -p "$WORK/tarballs"
for package in core memory redis sql zookeeper servers testkit cli; do
  (cd "packages/$package" && $PNPM pack --pack-destination "$WORK/tarballs" >/dev/null)
done
TARBALLS=$(ls "$WORK"/tarballs/*.tgz)
# the libraries' consumers below install these; @lockstep/cli has a project of its own (cli_consumer)
LIBRARY_TARBALLS=$(ls "$WORK"/tarballs/*.tgz | grep -v /lockstep-cli-)

echo "== packed manifests"
for tarball in $TARBALLS; do
  name=$(basename "$tarball" .tgz)
  mkdir -p "$WORK/unpacked/$name"
  tar -xzf "$tarball" -C "$WORK/unpacked/$name"
  node "$ROOT/scripts/consumer/check-packed.mjs" "$WORK/unpacked/$name/package" "$tarball"
done

echo "== publint and attw"
for tarball in $TARBALLS; do
  name=$(basename "$tarball" .tgz)
  "$ROOT/node_modules/.bin/publint" --strict --pack false "$WORK/unpacked/$name/package"
  # every resolution mode (node10 through typesVersions, node16 from CommonJS and ESM, bundler)
  "$ROOT/node_modules/.bin/attw" "$tarball" --format table-flipped --no-color
done

# strict settings of a careful consumer; types: [] so that only what is imported brings Node's
# types in (ioredis's declarations reference them; @types/node is installed as a Node project has it)
tsconfig() { # module moduleResolution lib files...
  local module=$1 resolution=$2 lib=$3
  shift 3
  node -e '
    const [module, moduleResolution, lib, ...files] = process.argv.slice(1)
    console.log(JSON.stringify({
      compilerOptions: {
        strict: true, exactOptionalPropertyTypes: true, noUncheckedIndexedAccess: true,
        noImplicitOverride: true, isolatedModules: true, erasableSyntaxOnly: true,
        skipLibCheck: false, types: [], lib: lib.split(","), target: "es2022",
        module, moduleResolution, noEmit: true
      },
      files
    }, null, 2))
  ' "$module" "$resolution" "$lib" "$@"
}

consumer() {
  local ioredis=$1 dir="$WORK/consumer-ioredis$1"
  mkdir -p "$dir"
  cp scripts/consumer/program.mjs scripts/consumer/program.cjs "$dir/"
  # the same TypeScript consumer as a CommonJS file (.ts: the package has no "type") and as an ES module
  cp scripts/consumer/consumer.ts "$dir/consumer.ts"
  cp scripts/consumer/consumer.ts "$dir/consumer.mts"
  echo '{ "name": "consumer", "version": "0.0.0", "private": true }' > "$dir/package.json"
  echo "== ioredis $ioredis: npm install of the tarballs"
  (cd "$dir" && npm install --loglevel=error --no-audit --no-fund $LIBRARY_TARBALLS "effect@^3.22.4" "ioredis@^$ioredis" \
    "@effect/sql@^0.52.1" "@effect/sql-pg@^0.53.0" "typescript@~5.9.3" "@types/node@^20" "vitest@^3.2.4" \
    "@effect/vitest@^0.29.0" >/dev/null)
  (cd "$dir" && node -e '
    for (const name of ["effect", "ioredis", "@effect/sql", "@effect/sql-pg", "typescript", "@lockstep/core", "@lockstep/redis", "@lockstep/sql"])
      process.stdout.write(`${name}@${require(name + "/package.json").version}  `)
    console.log()')
  # an application installs more packages later. With ioredis 6, npm refuses every later install:
  # @effect/experimental (a dependency of @effect/sql) has ioredis ^5 as an optional peer. Users
  # are told (README, Install) to pin ioredis 5, or to install with --legacy-peer-deps and have
  # @effect/sql's peers as dependencies of their own (npm then installs no peers, and removes the
  # ones it installed before); the programs and type checks below run on the result
  echo "== ioredis $ioredis: a second npm install in the project"
  if [ "$ioredis" = 6 ]; then
    if (cd "$dir" && npm install --loglevel=error --no-audit --no-fund "dotenv@^16" >second-install.log 2>&1); then
      echo "plain npm install dotenv: ok (no ERESOLVE any more: the README's note on ioredis 6 is out of date)"
    else
      grep -q ERESOLVE "$dir/second-install.log" || { cat "$dir/second-install.log"; exit 1; }
      echo "plain npm install dotenv: ERESOLVE as the README says ($(grep -m1 peerOptional "$dir/second-install.log" | sed 's/^npm error //'))"
    fi
    (cd "$dir" && npm install --loglevel=error --no-audit --no-fund --legacy-peer-deps \
      "@effect/experimental@^0.61.1" "@effect/platform@^0.97.2" "dotenv@^16" >/dev/null)
    echo "npm install --legacy-peer-deps @effect/experimental @effect/platform dotenv: ok"
  else
    (cd "$dir" && npm install --loglevel=error --no-audit --no-fund "dotenv@^16" >/dev/null)
    echo "npm install dotenv: ok"
  fi
  (cd "$dir" && node -e 'require("dotenv"); require("@effect/sql"); console.log("dotenv and @effect/sql resolve after it")')
  echo "== ioredis $ioredis: plain node, ES module and CommonJS"
  (cd "$dir" && timeout 120 node program.mjs && timeout 120 node program.cjs)
  # and on the other Node versions CI tests (LOCKSTEP_CONSUMER_NODE_BINS: their bin directories)
  for bin in ${LOCKSTEP_CONSUMER_NODE_BINS:-}; do
    echo "== ioredis $ioredis: node $("$bin/node" --version), ES module and CommonJS"
    (cd "$dir" && PATH="$bin:$PATH" timeout 120 node program.mjs && PATH="$bin:$PATH" timeout 120 node program.cjs)
  done
  echo "== ioredis $ioredis: tsc"
  tsconfig node16 node16 es2022 consumer.ts consumer.mts > "$dir/tsconfig.node16.json"
  tsconfig esnext bundler es2022 consumer.ts > "$dir/tsconfig.bundler.json"
  for resolution in node16 bundler; do
    (cd "$dir" && node_modules/.bin/tsc -p "tsconfig.$resolution.json" | head -n 40)
    echo "tsc -p tsconfig.$resolution.json: ok"
  done
  if [ "$ioredis" = 6 ]; then
    # every public entry point but those on ioredis (@lockstep/redis, @lockstep/testkit/RedisMock:
    # ioredis's types bring Node's), in a program without Node's types: effect's own declarations
    # need URL and AbortSignal, from lib dom
    (cd "$dir" && node -e '
      const entries = []
      for (const name of ["core", "memory", "servers", "testkit"]) {
        const manifest = require(`@lockstep/${name}/package.json`)
        for (const path of Object.keys(manifest.exports)) {
          const entry = manifest.name + path.slice(1)
          if (path !== "./package.json" && entry !== "@lockstep/testkit/RedisMock") entries.push(entry)
        }
      }
      const source = entries.map((entry, i) => `import * as E${i} from "${entry}"\n`).join("") +
        `export const entries = [${entries.map((_, i) => `E${i}`).join(", ")}]\n`
      require("node:fs").writeFileSync("entries.ts", source)
      require("node:fs").writeFileSync("entries.mts", source)
      console.log(`entries.ts: ${entries.length} entry points`)')
    tsconfig node16 node16 es2022,dom entries.ts entries.mts > "$dir/tsconfig.entries-node16.json"
    tsconfig esnext bundler es2022,dom entries.ts > "$dir/tsconfig.entries-bundler.json"
    for resolution in node16 bundler; do
      (cd "$dir" && node_modules/.bin/tsc -p "tsconfig.entries-$resolution.json" --listFilesOnly > files.txt)
      if grep -q "@types/node/" "$dir/files.txt"; then echo "entries: Node's types came into the program"; exit 1; fi
      (cd "$dir" && node_modules/.bin/tsc -p "tsconfig.entries-$resolution.json" | head -n 40)
      echo "tsc -p tsconfig.entries-$resolution.json (no Node types): ok"
    done
  fi
}
# @lockstep/sql's programs lock on the machine's PostgreSQL, in a database of this check's own
CONSUMER_DB="lockstep_consumer_$$"
psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $CONSUMER_DB"
trap 'psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS $CONSUMER_DB WITH (FORCE)"; if [ "${LOCKSTEP_KEEP_CONSUMER:-}" != 1 ]; then rm -rf "$WORK"; fi' EXIT
export LOCKSTEP_CONSUMER_PG_URL="postgres://postgres@127.0.0.1:5432/$CONSUMER_DB"
consumer 6
consumer 5

# @lockstep/cli: installed from its tarball (with those of the packages it depends on) into a project
# of its own, its `lockstep` bin run as a user runs it: `npx lockstep --help`, then `lockstep run`
# with plain node against a real redis-server (scripts/consumer/cli.mjs)
cli_consumer() {
  local dir="$WORK/consumer-cli"
  mkdir -p "$dir"
  cp scripts/consumer/cli.mjs "$dir/"
  echo '{ "name": "consumer-cli", "version": "0.0.0", "private": true }' > "$dir/package.json"
  echo "== @lockstep/cli: npm install of the tarballs"
  (cd "$dir" && npm install --loglevel=error --no-audit --no-fund $(ls "$WORK"/tarballs/lockstep-{core,redis,sql,zookeeper,cli}-*.tgz) >/dev/null)
  (cd "$dir" && npx --no-install lockstep --help | grep -q "lockstep run") || { echo "npx lockstep --help: no run command"; exit 1; }
  echo "npx lockstep --help: ok"
  (cd "$dir" && npx --no-install lockstep run --help | grep -q "EXAMPLES") || { echo "npx lockstep run --help: no examples"; exit 1; }
  (cd "$dir" && timeout 120 node cli.mjs)
  for bin in ${LOCKSTEP_CONSUMER_NODE_BINS:-}; do
    echo "== @lockstep/cli: node $("$bin/node" --version)"
    (cd "$dir" && PATH="$bin:$PATH" timeout 120 node cli.mjs)
  done
}
cli_consumer
# and installed globally from its tarball alone, run over Redis and PostgreSQL, its exit timed
bash scripts/consumer/cli-global.sh "$WORK/tarballs"

# the README's Install lines, verbatim (taken from README.md: a drift fails here), run as a new user
# runs them: in a new npm project that first did a plain `npm install effect` (npm's latest, Effect 4
# today), beside a directory holding the tarballs as the README lays it out; the global line into a
# prefix of the check's own (npm_config_prefix). Then the programs above and a vitest test file
# (readme.test.mjs, the testing line's packages) run in that project
readme_consumer() {
  local base="$WORK/readme"
  mkdir -p "$base/lockstep" "$base/app" "$base/global"
  ln -s "$WORK/tarballs" "$base/lockstep/tarballs"
  node -e '
    const readme = require("node:fs").readFileSync(process.argv[1], "utf8")
    const blocks = [...readme.matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map((m) => m[1])
    const install = blocks.filter((block) => block.startsWith("T=../lockstep/tarballs\n"))
    if (install.length !== 1) { console.error(`README.md: ${install.length} Install blocks starting with T=../lockstep/tarballs, not 1`); process.exit(1) }
    process.stdout.write(install[0])' "$ROOT/README.md" > "$base/install.sh"
  echo "== README: a new project, npm install effect (unpinned)"
  (cd "$base/app" && npm init -y >/dev/null && npm install --loglevel=error --no-audit --no-fund effect >/dev/null)
  echo "npm install effect: effect@$(cd "$base/app" && node -p 'require("effect/package.json").version')"
  echo "== README: the Install lines, verbatim"
  sed 's/^/  /' "$base/install.sh"
  (cd "$base/app" && npm_config_prefix="$base/global" npm_config_loglevel=error npm_config_audit=false npm_config_fund=false \
    bash -euo pipefail "$base/install.sh" >/dev/null)
  # the programs start their redis-server with @lockstep/servers, a tool of this check's own rather
  # than one the Install lines promise: installed beside them unless those lines name it
  if ! grep -q lockstep-servers- "$base/install.sh"; then
    (cd "$base/app" && npm install --loglevel=error --no-audit --no-fund --save-dev "$WORK"/tarballs/lockstep-servers-*.tgz >/dev/null)
  fi
  (cd "$base/app" && node -e '
    const versions = ["effect", "ioredis", "ioredis-mock", "@effect/sql", "@effect/sql-pg", "vitest", "@effect/vitest"]
      .map((name) => [name, require(name + "/package.json").version])
    console.log(versions.map(([name, version]) => `${name}@${version}`).join("  "))
    if (!versions[0][1].startsWith("3.")) { console.error("the README lines left effect " + versions[0][1]); process.exit(1) }')
  cp scripts/consumer/program.mjs scripts/consumer/program.cjs scripts/consumer/readme.test.mjs "$base/app/"
  (cd "$base/app" && timeout 120 node program.mjs && timeout 120 node program.cjs)
  (cd "$base/app" && timeout 300 npx --no-install vitest run --reporter=dot readme.test.mjs 2>&1 | tail -n 5)
  "$base/global/bin/lockstep" --help | grep -q "lockstep run" || { echo "the global lockstep: no help"; exit 1; }
  echo "the global install: $base/global/bin/lockstep --help: ok"
}
readme_consumer

# an application that loaded Effect 4 by mistake (peers not enforced) gets one line naming both
# versions from lockstep, from an ES module and from CommonJS, not a missing export
effect4_consumer() {
  local dir="$WORK/consumer-effect4"
  mkdir -p "$dir"
  echo "== Effect 4 loaded by mistake"
  (cd "$dir" && npm init -y >/dev/null && npm install --loglevel=error --no-audit --no-fund effect@^4 >/dev/null &&
    npm install --loglevel=error --no-audit --no-fund --legacy-peer-deps "$WORK"/tarballs/lockstep-{core,memory}-*.tgz >/dev/null)
  for program in 'import("@lockstep/memory")' 'require("@lockstep/memory")'; do
    if (cd "$dir" && node -e "$program" >out.log 2>&1); then echo "$program: loaded under Effect 4"; exit 1; fi
    local message
    message=$(grep -m1 "needs effect" "$dir/out.log") || { cat "$dir/out.log"; exit 1; }
    echo "$program: ${message#*Error: }"
  done
}
effect4_consumer
echo "consumer check: ok"
