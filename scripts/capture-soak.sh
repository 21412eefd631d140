#!/usr/bin/env bash
# The capture's long run (not in CI): pgbench writes for ROUNDS rounds while the capture is killed
# with kill -9 at random moments (during the snapshot copy, mid-stream, right after a Kafka commit),
# PostgreSQL is restarted and the broker halted and resumed, on both stores (SQLite and PostgreSQL),
# with two runners of which one is restarted each round. At the end: verify --against-source must
# be clean and check-log must find 0 violations, for each store.
#   scripts/capture-soak.sh                 6 rounds, scale 10 (1M accounts)
#   ROUNDS=20 SCALE=1 scripts/capture-soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-6}" scale="${SCALE:-10}"
bin="${KB_BIN:-target/release/kafka-backfill}"
[ -x "$bin" ] || cargo build --release --bin kafka-backfill
bootstrap="$(scripts/kafka.sh start)"
pg="$(scripts/postgres.sh start)"
stamp="$(date +%s)"
out=".run/capture-soak-$stamp"
mkdir -p "$out"
rand() { echo $((RANDOM % $1)); }

for store in sqlite postgres; do
  db="soak_${store}_$stamp"
  src="${pg%/*}/$db"
  psql "$pg" -qc "CREATE DATABASE $db"
  pgbench -i -q -s "$scale" "$src" 2>&1 | tail -n 1
  psql "$src" -qc "ALTER TABLE pgbench_accounts REPLICA IDENTITY FULL"
  if [ "$store" = sqlite ]; then
    st="store = { kind = \"sqlite\", path = \"$PWD/$out/$store.sqlite\", table = \"accounts\" }"
  else
    st="store = { kind = \"postgres\", url = \"$pg\", table = \"soak_accounts_$stamp\" }"
  fi
  cfg="$out/$store.toml"
  cat >"$cfg" <<EOF
[http]
listen = ""
[[jobs]]
name = "soak-$store-$stamp"
topic = "soak-$store-$stamp"
vnode_count = 256
snapshot = { kind = "files", dir = "$PWD/$out/$store-snapshot" }
$st
[jobs.kafka]
"bootstrap.servers" = "$bootstrap"
[jobs.recreation]
policy = "reschedule"
[jobs.capture]
source_url = "$src"
table = "public.pgbench_accounts"
checkpoint_interval_ms = 500
EOF
  start_capture() { RUST_LOG=info,pg_walstream=warn "$bin" capture --config "$cfg" 2>>"$out/$store-capture.log" & capture=$!; }
  # stdout away from the command substitution, or $(start_run …) would wait for the runner to exit.
  start_run() { "$bin" run --config "$cfg" --worker-prefix "$1" >/dev/null 2>>"$out/$store-run-$1.log" & echo $!; }
  start_capture
  # A kill during the copy of the snapshot, then a fresh start.
  sleep "0.$(rand 9)"
  kill -9 "$capture" 2>/dev/null || true; wait "$capture" 2>/dev/null || true
  echo "$store: capture killed during its snapshot"
  start_capture
  until grep -q "capture progress" "$out/$store-capture.log"; do sleep 0.2; done
  ra="$(start_run a)"; rb="$(start_run b)"
  for round in $(seq 1 "$rounds"); do
    pgbench -n -c 2 -R 150 -T 12 "$src" >/dev/null 2>&1 & bench=$!
    sleep "$((2 + $(rand 6))).$(rand 9)"
    case $((round % 3)) in
      0) kill -9 "$capture"; wait "$capture" 2>/dev/null || true; echo "$store round $round: capture kill -9"
         start_capture ;;
      1) scripts/postgres.sh restart; echo "$store round $round: PostgreSQL restarted"
         wait "$bench" 2>/dev/null || true
         pgbench -n -c 2 -R 150 -T 6 "$src" >/dev/null 2>&1 & bench=$! ;;
      2) scripts/kafka.sh halt >/dev/null; sleep 5; scripts/kafka.sh resume >/dev/null
         echo "$store round $round: broker halted 5 s" ;;
    esac
    kill -9 "$rb" 2>/dev/null || true; wait "$rb" 2>/dev/null || true; rb="$(start_run b)"
    wait "$bench" 2>/dev/null || true
  done
  echo "$store: waiting for the replica to equal the source…"
  ok=""
  for _ in $(seq 1 300); do
    if "$bin" verify --config "$cfg" --against-source >"$out/$store-verify.txt" 2>&1; then ok=1; break; fi
    sleep 1
  done
  cat "$out/$store-verify.txt"
  "$bin" check-log --config "$cfg" >"$out/$store-check-log.txt" || { tail -n 5 "$out/$store-check-log.txt"; echo "$store: check-log found violations"; exit 1; }
  tail -n 1 "$out/$store-check-log.txt"
  kill "$capture" "$ra" "$rb" 2>/dev/null || true; wait 2>/dev/null || true
  [ -n "$ok" ] || { echo "$store: NOT equal to the source (logs in $out)"; exit 1; }
done
echo "capture soak: both stores equal to the source after $rounds rounds each (logs in $out)"
