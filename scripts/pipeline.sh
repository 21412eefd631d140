#!/usr/bin/env bash
# The whole pipeline for a person to watch: pgbench writing into PostgreSQL, `kafka-backfill capture`
# turning pgbench_accounts into a snapshot and a Kafka log store, `kafka-backfill run` materialising
# it into SQLite, a live line per second (the slot's confirmed position and its lag behind the WAL,
# the replica's phase and epoch lag), and at the end a clean `verify --against-source`.
#   scripts/pipeline.sh                 scale 1 (100,000 accounts), pgbench at 200 tps for 30 s
#   SCALE=10 RATE=500 SECS=60 scripts/pipeline.sh
# Uses target/release/kafka-backfill (built if absent; KB_BIN overrides), the repo's Kafka and
# PostgreSQL (started if needed). Everything lands in .run/pipeline/.
set -euo pipefail
cd "$(dirname "$0")/.."
scale="${SCALE:-1}" rate="${RATE:-200}" secs="${SECS:-30}"
bin="${KB_BIN:-target/release/kafka-backfill}"
[ -x "$bin" ] || cargo build --release --bin kafka-backfill
bootstrap="$(scripts/kafka.sh start)"
pg="$(scripts/postgres.sh start)"
stamp="$(date +%s)"
db="pipeline_$stamp"
src="${pg%/*}/$db"
out=.run/pipeline
rm -rf "$out"; mkdir -p "$out"
psql "$pg" -qc "CREATE DATABASE $db"
pgbench -i -q -s "$scale" "$src" 2>&1 | tail -n 1
psql "$src" -qc "ALTER TABLE pgbench_accounts REPLICA IDENTITY FULL"

config() {  # $1 = http listen address ("" for none)
  cat <<EOF
[http]
listen = "$1"
[[jobs]]
name = "pipeline$stamp"
topic = "pipeline-$stamp"
vnode_count = 256
snapshot = { kind = "files", dir = "$PWD/$out/snapshot" }
store = { kind = "sqlite", path = "$PWD/$out/replica.sqlite", table = "pgbench_accounts" }
[jobs.kafka]
"bootstrap.servers" = "$bootstrap"
[jobs.capture]
source_url = "$src"
table = "public.pgbench_accounts"
EOF
}
config "" >"$out/capture.toml"
config "127.0.0.1:9464" >"$out/run.toml"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"$bin" capture --config "$out/capture.toml" 2>"$out/capture.log" & pids+=($!)
echo "capture: copying the snapshot (log: $out/capture.log)…"
until grep -q "snapshot copied" "$out/capture.log"; do
  kill -0 "${pids[0]}" 2>/dev/null || { tail -n 20 "$out/capture.log"; exit 1; }
  sleep 0.2
done
grep "snapshot copied" "$out/capture.log" | sed 's/.*INFO //'
"$bin" run --config "$out/run.toml" 2>"$out/run.log" & pids+=($!)
pgbench -n -c 2 -R "$rate" -T "$secs" "$src" >"$out/pgbench.log" 2>&1 & bench=$!
echo "pgbench: $rate transactions/s for $secs s; the replica: $out/replica.sqlite"
slot="kb_pipeline$stamp"
while kill -0 "$bench" 2>/dev/null; do
  lag="$(psql "$src" -tAc "SELECT confirmed_flush_lsn || ' (' || pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)) || ' behind the WAL)' FROM pg_replication_slots WHERE slot_name = '$slot'")"
  # The first worker row of `status`'s table: job, worker, phase, generation, partitions, …
  replica="$("$bin" status 2>/dev/null | sed -n '/^JOB /{n;p;q}' | tr -s ' ' || true)"
  printf '%s  capture: slot at %s | replica: %s\n' "$(date +%T)" "$lag" "${replica:-starting}"
  sleep 1
done
wait "$bench" || true
tail -n 3 "$out/pgbench.log" | sed 's/^/pgbench: /'
echo "pgbench done; waiting for the replica to equal the source…"
"$bin" verify --config "$out/run.toml" --against-source --within-secs 120
