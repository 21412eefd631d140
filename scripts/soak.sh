#!/usr/bin/env bash
# Soak the deterministic simulation: SOAK_SEEDS seeds (default 100,000) in chunks of SOAK_CHUNK
# (default 10,000) from SOAK_FIRST (default 0), release build. Not run by CI (minutes to hours).
# Every failing seed prints its one-line replay:
#   SIM_SEED=<seed> cargo test --features testing --test it -- --exact simulation::replay --nocapture
# Exit 1 if any seed failed.
set -euo pipefail
cd "$(dirname "$0")/.."
total=${SOAK_SEEDS:-100000}
chunk=${SOAK_CHUNK:-10000}
first=${SOAK_FIRST:-0}
failed=0
start=$(date +%s)
for ((from = first; from < first + total; from += chunk)); do
  n=$(( chunk < first + total - from ? chunk : first + total - from ))
  log=$(mktemp)
  if SIM_FIRST_SEED=$from SIM_SEEDS=$n cargo test --release --quiet --features testing --test it \
      simulation::random_schedules_against_the_oracle -- --nocapture >"$log" 2>&1; then
    echo "seeds $from..$((from + n)): ok ($(grep -o '[0-9]* commits' "$log" | head -1)) after $(( $(date +%s) - start )) s"
  else
    failed=1
    echo "seeds $from..$((from + n)): FAILED"
    grep -E 'seeds failed|simulation seed [0-9]+ failed|replay: ' "$log" || tail -20 "$log"
  fi
  rm -f "$log"
done
[ "$failed" = 0 ] && echo "soak: $total seeds from $first, none failed" || { echo "soak: failures above"; exit 1; }
