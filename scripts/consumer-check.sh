#!/usr/bin/env bash
# Checks the packages as they are published: builds and packs every package, installs the tarballs
# with npm into a new project outside the workspace, runs an ES module and a CommonJS program with
# plain node (memory backend and a real redis-server, with ioredis 6 and with ioredis 5), type-checks
# a TypeScript consumer under moduleResolution node16 and bundler (strict, no skipLibCheck, types: []),
# and runs publint and @arethetypeswrong/cli on every tarball. Any failure fails the check.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PNPM="npx -y pnpm@10.34.9"
WORK=$(mktemp -d)
# LOCKSTEP_KEEP_CONSUMER=1 keeps the temporary projects to look into
[ "${LOCKSTEP_KEEP_CONSUMER:-}" = 1 ] && echo "working in $WORK" || trap 'rm -rf "$WORK"' EXIT

$PNPM build
mkdir -p "$WORK/tarballs"
for package in core memory redis testkit; do
  (cd "packages/$package" && $PNPM pack --pack-destination "$WORK/tarballs" >/dev/null)
done
TARBALLS=$(ls "$WORK"/tarballs/*.tgz)

echo "== publint and attw"
for tarball in $TARBALLS; do
  name=$(basename "$tarball" .tgz)
  mkdir -p "$WORK/unpacked/$name"
  tar -xzf "$tarball" -C "$WORK/unpacked/$name"
  # packed manifests carry real versions and the built exports, never workspace links or sources
  node -e '
    const m = require(process.argv[1])
    const text = JSON.stringify(m)
    if (text.includes("workspace:")) throw new Error(m.name + ": a workspace: range was packed")
    if (text.includes("/src/") && JSON.stringify(m.exports).includes(".ts\"")) throw new Error(m.name + ": exports point at sources")
    if (JSON.stringify(m.exports).includes("internal")) throw new Error(m.name + ": internal modules are exported")
  ' "$WORK/unpacked/$name/package/package.json"
  for file in LICENSE README.md; do
    [ -f "$WORK/unpacked/$name/package/$file" ] || { echo "$name: $file is not packed"; exit 1; }
  done
  if tar -tzf "$tarball" | grep -q "/test/"; then echo "$name: tests are packed"; exit 1; fi
  "$ROOT/node_modules/.bin/publint" --strict --pack false "$WORK/unpacked/$name/package"
  "$ROOT/node_modules/.bin/attw" "$tarball" --profile node16 --format table-flipped
done

consumer() {
  local ioredis=$1 dir="$WORK/consumer-ioredis$1"
  mkdir -p "$dir"
  cp scripts/consumer/program.mjs scripts/consumer/program.cjs scripts/consumer/consumer.ts "$dir/"
  echo '{ "name": "consumer", "version": "0.0.0", "private": true }' > "$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error $TARBALLS \
    "effect@^3.22.4" "ioredis@^$ioredis" "typescript@~5.9.3" "@types/node@^20" "vitest@^3.2.4" "@effect/vitest@^0.29.0" >/dev/null)
  echo "== ioredis $ioredis: plain node, ES module and CommonJS"
  (cd "$dir" && node program.mjs && node program.cjs)
  echo "== ioredis $ioredis: tsc, moduleResolution node16 and bundler"
  for resolution in node16 bundler; do
    local module=$resolution
    [ "$resolution" = bundler ] && module=esnext
    (cd "$dir" && node_modules/.bin/tsc --noEmit --strict --skipLibCheck false --types node --erasableSyntaxOnly \
      --exactOptionalPropertyTypes --target es2022 --module "$module" --moduleResolution "$resolution" consumer.ts)
    echo "tsc --moduleResolution $resolution: ok"
  done
}
consumer 6
consumer 5
echo "consumer check: ok"
