#!/usr/bin/env bash
# The `lockstep` command installed as a user installs it: `npm install -g` of the @lockstep/cli
# tarball alone, into a prefix of its own (scripts/consumer-check.sh runs it on the packed tarballs).
#
#   scripts/consumer/cli-global.sh TARBALLS_DIR
#
# With that prefix's bin on PATH it checks: `lockstep --help` piped has no escape sequences;
# `lockstep run KEY -- true` over Redis (a redis-server it starts on a free loopback port, also
# with --prefix) and over PostgreSQL (127.0.0.1:5432, user postgres, a database of its own, dropped
# afterwards) exits 0 within a second of its command (the time from the command's end to
# lockstep's exit is printed); the installed tree holds at most one copy of effect. Any failure
# fails the script. LOCKSTEP_KEEP_CONSUMER=1 keeps the temporary directory.
set -euo pipefail
TARBALLS=$(cd "${1:?usage: cli-global.sh TARBALLS_DIR}" && pwd)
TARBALL=$(ls "$TARBALLS"/lockstep-cli-*.tgz)
WORK=$(mktemp -d)
DB="lockstep_cli_global_$$"
REDIS_PID=
cleanup() {
  if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; fi
  psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  if [ "${LOCKSTEP_KEEP_CONSUMER:-}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
fail() { echo "cli-global: $*" >&2; exit 1; }

echo "== npm install -g --prefix <temp> $(basename "$TARBALL") (alone)"
PREFIX="$WORK/prefix"
start=$(date +%s%N)
npm install -g --prefix "$PREFIX" --loglevel=error --no-audit --no-fund "$TARBALL" >/dev/null
echo "installed in $(( ($(date +%s%N) - start) / 1000000 )) ms"
export PATH="$PREFIX/bin:$PATH"
[ "$(command -v lockstep)" = "$PREFIX/bin/lockstep" ] || fail "lockstep is not the prefix's: $(command -v lockstep)"
effects=$(find "$PREFIX" -path '*/node_modules/effect/package.json' | wc -l)
echo "installed tree: $(find "$PREFIX" -name package.json -path '*/node_modules/*' -not -path '*/node_modules/*/node_modules/*/*/*' | wc -l) package manifests, $effects copies of effect in node_modules (the bin has its own inlined), $(find "$PREFIX" -path '*/node_modules/ioredis/package.json' | wc -l) of ioredis"
[ "$effects" -le 1 ] || fail "$effects copies of effect: $(find "$PREFIX" -path '*/node_modules/effect/package.json')"

echo "== lockstep --help, piped"
help=$(lockstep --help)
grep -q "lockstep run" <<<"$help" || fail "lockstep --help has no run command"
if grep -q $'\e' <<<"$help"; then fail "lockstep --help piped has escape sequences"; fi
echo "no escape sequences; $(grep -o 'run a command under a lock held on[^.]*' <<<"$help")"

# runs `lockstep run ARGS -- sh -c 'date > stamp'`; prints how long lockstep took to exit after its command
lag() { # label args...
  local label=$1 stamp="$WORK/stamp" start end code
  shift
  rm -f "$stamp"
  start=$(date +%s%N)
  code=0
  lockstep run "$@" -- sh -c "date +%s%N > $stamp" || code=$?
  end=$(date +%s%N)
  [ "$code" = 0 ] || fail "$label: lockstep run exited $code"
  local lag_ms=$(( (end - $(cat "$stamp")) / 1000000 ))
  echo "$label: exit 0, $(( (end - start) / 1000000 )) ms in all, exited $lag_ms ms after its command"
  [ "$lag_ms" -lt 1000 ] || fail "$label: lockstep exited $lag_ms ms after its command (more than 1 s)"
}

echo "== lockstep run over Redis"
PORT=$(node -e 'const s = require("node:net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close() })')
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
for i in $(seq 1 100); do
  if [ "$(redis-cli -p "$PORT" ping 2>/dev/null)" = PONG ]; then break; fi
  [ "$i" -lt 100 ] || fail "redis-server did not start: $(cat "$WORK/redis.log")"
  sleep 0.05
done
REDIS="redis://127.0.0.1:$PORT"
lag "redis, default watchdog" -b "$REDIS" global
lag "redis, --watchdog 3s" -b "$REDIS" --watchdog 3s global
lag "redis, --lease 5s" -b "$REDIS" --lease 5s global
lag "redis, --prefix app:" -b "$REDIS" --prefix app: global
keys=$(redis-cli -p "$PORT" --scan --pattern 'app:*' | wc -l)
status=$(lockstep status -b "$REDIS" --prefix app: --json global)
grep -q '"key": "global"' <<<"$status" || fail "status --prefix app: $status"
echo "redis, --prefix app:: $keys keys under app: (status finds the key there)"

echo "== lockstep run over PostgreSQL"
psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $DB"
lag "postgres" -b "postgres://postgres@127.0.0.1:5432/$DB" global
lag "postgres, --lease 5s" -b "postgres://postgres@127.0.0.1:5432/$DB" --lease 5s global
refused=$(lockstep run -b "postgres://postgres@127.0.0.1:5432/$DB" --prefix app: global -- true 2>&1) && fail "postgres --prefix was not refused"
echo "postgres, --prefix app:: refused: $refused"

echo "== sqlite: without better-sqlite3"
code=0
out=$(lockstep run -b "sqlite:$WORK/locks.db" global -- true 2>&1) || code=$?
grep -q "better-sqlite3" <<<"$out" || fail "sqlite: exit $code, $out"
echo "sqlite: exit $code: $out"
echo "cli global install: ok"
