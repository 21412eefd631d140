#!/usr/bin/env bash
# How long a replica stands still after `kill -9` of its runner and an immediate restart, under
# pgbench load: once as a dynamic group member (no --worker-prefix: the partitions move only when
# the dead member's session ends, session.timeout.ms = 10 s as in every shipped config), once as a
# static member (`run --worker-prefix r`: the restarted process is the same member and gets its
# partitions back at once). The window runs from the kill to the first change the restarted runner
# commits to the replica (a new sum of abalance in SQLite, read every 100 ms), so it ends when the
# result is durable in the store. Prints both and their ratio.
#   scripts/crash-restart.sh            pgbench at 200 tps, scale 1
# Uses target/release/kafka-backfill (built if absent; KB_BIN overrides), the repo's Kafka and
# PostgreSQL (started if needed; PostgreSQL durable: fsync on). Everything lands in .run/crash-restart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${KB_BIN:-target/release/kafka-backfill}"
[ -x "$bin" ] || cargo build --release --bin kafka-backfill
bootstrap="$(scripts/kafka.sh start)"
pg="$(scripts/postgres.sh start)"
stamp="$(date +%s)"
db="crash_$stamp"
src="${pg%/*}/$db"
out=.run/crash-restart
rm -rf "$out"; mkdir -p "$out"
psql "$pg" -qc "CREATE DATABASE $db"
pgbench -i -q -s 1 "$src" 2>&1 | tail -n 1
psql "$src" -qc "ALTER TABLE pgbench_accounts REPLICA IDENTITY FULL"
cat >"$out/job.toml" <<EOF
[http]
listen = ""
[[jobs]]
name = "crash$stamp"
topic = "crash-$stamp"
vnode_count = 256
snapshot = { kind = "files", dir = "$PWD/$out/snapshot" }
store = { kind = "sqlite", path = "$PWD/$out/replica.sqlite", table = "pgbench_accounts" }
[jobs.kafka]
"bootstrap.servers" = "$bootstrap"
"session.timeout.ms" = "10000"
[jobs.capture]
source_url = "$src"
table = "public.pgbench_accounts"
EOF

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"$bin" capture --config "$out/job.toml" 2>"$out/capture.log" & pids+=($!)
pgbench -n -c 2 -R 200 -T 600 "$src" >"$out/pgbench.log" 2>&1 & pids+=($!)

sum() { sqlite3 "$out/replica.sqlite" 'SELECT coalesce(sum(abalance), 0) FROM pgbench_accounts' 2>/dev/null || echo none; }
now() { date +%s.%N; }
# Waits until the replica's sum differs from $1 (the replica moves); prints when.
moved_after() {
  local from="$1" deadline=$(( $(date +%s) + 120 ))
  while [ "$(sum)" = "$from" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "the replica did not move within 120 s" >&2; exit 1; }
    sleep 0.1
  done
  now
}
start_run() { "$bin" run --config "$out/job.toml" "$@" >/dev/null 2>>"$out/run.log" & run=$!; pids+=($run); }
# kill -9 of the runner, restarted at once with the same arguments: sets $gap, the seconds until the
# replica moves again.
crash_gap() {
  moved_after "$(sum)" >/dev/null   # streaming and moving before the crash
  kill -9 "$run"; wait "$run" 2>/dev/null || true
  local killed at_kill moved
  killed="$(now)"
  at_kill="$(sum)"
  start_run "$@"
  moved="$(moved_after "$at_kill")"
  gap="$(awk "BEGIN { printf \"%.2f\", $moved - $killed }")"
}

start_run
until grep -q 'to="streaming"' "$out/run.log"; do sleep 0.2; done
crash_gap
dynamic="$gap"
echo "dynamic member: replica moving again $dynamic s after kill -9 and an immediate restart"
kill -TERM "$run"; wait "$run" 2>/dev/null || true   # leaves the group
start_run --worker-prefix r
crash_gap --worker-prefix r
static="$gap"
echo "static member (--worker-prefix r): replica moving again $static s after kill -9 and an immediate restart"
echo "ratio static/dynamic: $(awk "BEGIN { printf \"%.3f\", $static / $dynamic }")"
