#!/usr/bin/env bash
# The test command README gives: installs what the tests need and the machine lacks
# (scripts/deps.sh), starts the real Kafka broker, PostgreSQL and MariaDB if needed, then runs every test:
# the unit tests of both crates, then the one integration binary (tests/it/main.rs) with up to
# KB_TEST_LANES (default 3) real-process tests at once, then its `outages` module alone on a fresh
# broker (it stops the broker and PostgreSQL the others share), and prints the ten slowest tests.
# KAFKA_BOOTSTRAP points integration tests at the broker.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
KAFKA_BOOTSTRAP="$(scripts/kafka.sh start)"
export KAFKA_BOOTSTRAP
scripts/postgres.sh start >/dev/null
scripts/mariadb.sh start >/dev/null
export SIM_SEEDS="${SIM_SEEDS:-1000}"
# --features testing: the simulator, the in-memory doubles and the deliberate bugs (switched on only
# inside the test that proves each is caught).
cargo test --workspace --features testing --lib --bins --tests --no-run
bin=$(cargo test --features testing --test it --no-run 2>&1 | sed -nE 's|.*Executable tests/it/main.rs \((.*)\)|\1|p')
[ -x "$bin" ] || { echo "test.sh: could not find the integration test binary" >&2; exit 1; }
times=$(mktemp)
# One target failing does not hide the others' results: every step runs, the exit code is the worst.
status=0
set +e
cargo test --workspace --features testing --lib --bins -- --nocapture 2>&1 \
  | grep --line-buffered -vE '^test .* \.\.\. ok$'
[ "${PIPESTATUS[0]}" = 0 ] || status=1
# The integration binary is run directly so each test's time can be reported (libtest's
# --report-time is unstable: RUSTC_BOOTSTRAP=1 for this process only, the build is untouched).
it() { RUSTC_BOOTSTRAP=1 "$bin" -Z unstable-options --report-time --nocapture "$@" 2>&1 | tee -a "$times" \
  | grep --line-buffered -vE '^test .* \.\.\. ok <[0-9.]+s>$'; return "${PIPESTATUS[0]}"; }
# libtest runs as many tests at once as the machine has cores (two here) unless told: one more
# thread than lanes, so the real-process tests fill their lanes while a pure one runs beside them.
lanes="${KB_TEST_LANES:-3}"
it --skip outages:: --test-threads="$((lanes + 1))" || status=1
# The outage tests stop and restart the broker: they get a fresh one, so a restart does not load
# again the hundreds of topics the main pass left (a clean CI run's first outage test took 294 s
# where it takes 60 s alone, and its replica had not caught up within the test's two minutes).
scripts/kafka.sh clean
KAFKA_BOOTSTRAP="$(scripts/kafka.sh start)" || status=1
it outages:: --test-threads=1 || status=1
set -e
echo "== the ten slowest tests"
sed -nE 's/^test (.*) \.\.\. (ok|FAILED) <([0-9.]+)s>$/\3 s  \1 (\2)/p' "$times" | sort -rn | sed -n '1,10p'   # sed reads everything: no SIGPIPE under pipefail
rm -f "$times"
# The Helm chart, offline (lint, render, Kubernetes schemas, check-config on the rendered config).
KB_BIN=target/debug/kafka-backfill scripts/helm-check.sh
exit "$status"
