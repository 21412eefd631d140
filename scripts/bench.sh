#!/usr/bin/env bash
# The benchmark: starts the real broker and PostgreSQL, builds the release binary, runs the harness.
#   scripts/bench.sh            full size (a few million records, 1M-row snapshot, 1M and 10M backlogs)
#   scripts/bench.sh --quick    a tenth of that (what CI may run to keep the command working)
# Extra flags: --log-changes N --snapshot-rows N --memory-small N --memory-large N --partitions N --json FILE
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/kafka.sh start >/dev/null
scripts/postgres.sh start >/dev/null
cargo build --release --bin kafka-backfill
cargo bench --bench backfill -- "$@"
