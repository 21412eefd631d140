#!/usr/bin/env bash
# The test command README gives: starts the real Kafka broker if needed, then runs every test.
# KAFKA_BOOTSTRAP points integration tests at the broker.
set -euo pipefail
cd "$(dirname "$0")/.."
KAFKA_BOOTSTRAP="$(scripts/kafka.sh start)"
export KAFKA_BOOTSTRAP
scripts/postgres.sh start >/dev/null
export SIM_SEEDS="${SIM_SEEDS:-1000}"
cargo test --lib --bins --tests -- --nocapture 2>&1 | grep -vE '^test .* \.\.\. ok$'
exit "${PIPESTATUS[0]}"
