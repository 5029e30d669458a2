#!/usr/bin/env bash
# A job that runs once across a fleet, with the `lockstep` command: four copies of
#
#   lockstep run --no-wait --conflict-exit-code 0 reports:nightly -- <the report>
#
# started at the same moment, as the crontab line of four hosts would. One runs the report; the
# others skip it, exit 0 and say on stderr who holds the lock.
#
#   bash examples/run-once/cli.sh     (REDIS_URL, default redis://127.0.0.1:6379; the bin is built
#                                      by `npx -y pnpm@10.34.9 build`)
#
# Exits 0 when exactly one copy ran the report; 1 otherwise.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$root/packages/cli/dist/bin/lockstep.cjs"
if [ ! -f "$bin" ]; then
  echo "no $bin: build it first with: npx -y pnpm@10.34.9 build" >&2
  exit 1
fi
lockstep() { node "$bin" "$@"; }

# the backend and a key namespace of this run's own (lockstep reads both from the environment)
export LOCKSTEP_BACKEND="${REDIS_URL:-redis://127.0.0.1:6379}"
export LOCKSTEP_PREFIX="lockstep-example:run-once-cli:$(node -p 'crypto.randomUUID().slice(0, 8)'):"
run=$(mktemp -d)
cleanup() {
  rm -rf "$run"
  # the keys expire by themselves within a lease (30 s); with redis-cli at hand they go at once
  if command -v redis-cli >/dev/null 2>&1; then
    redis-cli -u "$LOCKSTEP_BACKEND" --scan --pattern "$LOCKSTEP_PREFIX*" | xargs -r redis-cli -u "$LOCKSTEP_BACKEND" del >/dev/null
  fi
}
trap cleanup EXIT

# The report: it prints its host and fence, then works until the other hosts have given up (a real
# report takes as long as it takes; here the hosts must not finish before the others have tried).
# shellcheck disable=SC2016 # expanded by the report's shell, not this one
report='echo "host $HOST ran the report (fence $LOCKSTEP_FENCE)"
for _ in $(seq 1 200); do [ -f "$RUN/others-done" ] && exit 0; sleep 0.05; done'

echo "4 hosts run the nightly report's crontab line at the same moment:"
pids=()
for host in 1 2 3 4; do
  HOST=$host RUN=$run lockstep run --no-wait --conflict-exit-code 0 reports:nightly -- sh -c "$report" \
    >"$run/$host.out" 2>"$run/$host.err" &
  pids+=($!)
done
# the three that skip it exit at once; then the report may end
running() { for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && echo "$pid"; done | wc -l; }
while [ "$(running)" -gt 1 ]; do sleep 0.05; done
touch "$run/others-done"
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done

for host in 1 2 3 4; do
  sed "s/^/  /" "$run/$host.out"
  sed "s/^/  host $host skipped it: /" "$run/$host.err"
done
ran=$(cat "$run"/*.out | grep -c "ran the report" || true)
if [ "$status" -ne 0 ] || [ "$ran" -ne 1 ]; then
  echo "FAILED: $ran hosts ran the report (exit status $status)" >&2
  exit 1
fi
echo "ok: exactly one of 4 hosts ran it"
