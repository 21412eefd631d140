#!/usr/bin/env bash
# The benchmark: starts the real broker and a durable PostgreSQL (fsync=on, synchronous_commit=on)
# (section mariadb starts a durable MariaDB: sync_binlog=1, innodb_flush_log_at_trx_commit=1),
# builds the binary, runs the harness (benches/backfill.rs), which prints every figure with what it
# measures and every target with met/missed, and writes JSON (--json FILE, default
# target/bench/results.json).
#   scripts/bench.sh            full size: 1M changes per log topic (4, 16, 64 partitions), a 1M-row
#                               snapshot, 1M- and 10M-record backlogs, medians of 3 (~20 minutes)
#   scripts/bench.sh --quick    a tenth of that, one repetition each
#   scripts/bench.sh --ci       just enough to prove every section still runs (.ci/run uses it;
#                               never judged on a time). KB_BENCH_PROFILE=dev reuses the test build
# Extra flags: --only log,snapshot,commit,memory,single-file,recreate,reschedule,adaptive,scale,consistency,pg-key,pg-ceiling,capture,schema,several-tables,staging,peer,dba-copy,many-tables,mariadb,cluster
#              --reps N
#              --log-changes N --snapshot-rows N --memory-small N --memory-large N
#              --single-file-small N --single-file-large N --commit-samples N --json FILE
#              --adaptive-target-ms N (100) --load-tps N (150: the competing application)
#              --capture-small-scale N --capture-large-scale N --stream-tps N (section capture:
#              pgbench scales of its two tables, and pgbench's rate while it streams)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/kafka.sh start >/dev/null
KB_PG_DURABLE=1 scripts/postgres.sh start >/dev/null
profile="${KB_BENCH_PROFILE:-release}"
if [ "$profile" = dev ]; then
  # The binary exactly as scripts/test.sh builds it (the same command, so the same feature set):
  # after the tests it is up to date. `cargo build --bin` alone leaves the dev-dependencies out, and
  # their features with them, so it compiled every dependency again (2.5 minutes of CI).
  cargo test --workspace --features testing --lib --bins --tests --no-run
  KB_BENCH_PROFILE=dev KB_BIN=target/debug/kafka-backfill \
    cargo bench --profile dev --features testing --bench backfill -- "$@"
else
  cargo build --release --bin kafka-backfill
  KB_BENCH_PROFILE=release KB_BIN=target/release/kafka-backfill cargo bench --bench backfill -- "$@"
fi
