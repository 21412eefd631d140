#!/usr/bin/env bash
# Mutation testing of the pure core (crates/core) with cargo-mutants: every mutant of
# kafka-backfill-core is built and the core's own tests run against it. Not run by CI (about half an
# hour on 2 cores). The summary goes to docs/TESTING.md by hand; the full lists land in
# target/mutants/mutants.out/{caught,missed,timeout,unviable}.txt. faults.rs is excluded: its code
# exists only under the `testing` feature (the deliberate bugs), which the core's own tests do not enable.
# Usage: scripts/mutants.sh [extra cargo-mutants arguments, e.g. -f crates/core/src/vnode.rs]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
cargo mutants -p kafka-backfill-core --exclude crates/core/src/faults.rs --timeout 30 --jobs "${MUTANTS_JOBS:-1}" \
  --output target/mutants "$@" || true
out=target/mutants/mutants.out
for f in caught missed timeout unviable; do
  printf '%-9s %s\n' "$f" "$(wc -l < "$out/$f.txt" 2>/dev/null || echo 0)"
done
caught=$(wc -l < "$out/caught.txt"); missed=$(wc -l < "$out/missed.txt")
timeout=$(wc -l < "$out/timeout.txt")
viable=$((caught + missed + timeout))
echo "caught $caught of $viable viable mutants ($((100 * (caught + timeout) / viable))% with timeouts counted as caught)"
