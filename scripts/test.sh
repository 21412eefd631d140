#!/usr/bin/env bash
# The test command README gives: installs what the tests need and the machine lacks
# (scripts/deps.sh), starts the real Kafka broker and PostgreSQL if needed, then runs every test.
# KAFKA_BOOTSTRAP points integration tests at the broker.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
KAFKA_BOOTSTRAP="$(scripts/kafka.sh start)"
export KAFKA_BOOTSTRAP
scripts/postgres.sh start >/dev/null
export SIM_SEEDS="${SIM_SEEDS:-1000}"
# --no-fail-fast: one failing target does not hide the others' results. --features testing:
# the simulator, the in-memory doubles and the deliberate bugs (switched on only inside the test that
# proves each is caught).
set +e
cargo test --workspace --no-fail-fast --features testing --lib --bins --tests -- --nocapture 2>&1 | grep --line-buffered -vE '^test .* \.\.\. ok$'
tests=${PIPESTATUS[0]}
set -e
# The Helm chart, offline (lint, render, Kubernetes schemas, check-config on the rendered config).
KB_BIN=target/debug/kafka-backfill scripts/helm-check.sh
exit "$tests"
