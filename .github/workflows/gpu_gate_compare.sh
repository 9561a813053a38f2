#!/usr/bin/env bash
# The GPU gate's compare step (gpu-regression.yml), kept in a file so it can be run and tested locally:
#   GITHUB_STEP_SUMMARY=/tmp/summary.md bash .github/workflows/gpu_gate_compare.sh
# Without a stored baseline it explains how to create one and exits 0; otherwise it is the gate
# (exit 0 pass, 1 regression, 2 cannot compare, 3 inconclusive: fails the job too, unless the
# policy's `inconclusive: pass` maps it to 0).
set -euo pipefail
BASE=${BASE:-baselines/ci_gate/results.jsonl}
POLICY=${POLICY:-baselines/ci_gate/policy.yaml}
NEW=${NEW:-runs/ci/results.jsonl}
SUMMARY=${GITHUB_STEP_SUMMARY:-/dev/stdout}

if [ ! -s "$BASE" ]; then
  cat >> "$SUMMARY" <<MARKDOWN
### GPU gate: no baseline yet

\`$BASE\` is not in the repository, so there is nothing to compare this run with and the gate did
not run (this job passes). To create the baseline from this runner:

1. Run this workflow by hand (Actions -> gpu-regression -> Run workflow) with **refresh_baseline** set.
2. Download its \`ci-gate-new-baseline\` artifact and commit its \`results.jsonl\` as \`$BASE\`
   in a pull request that says which runner (GPU, driver, CUDA, torch) made it.

From then on every pull request's run is compared with it under \`$POLICY\`. This run's results are in
the \`ci-gate-report\` artifact.
MARKDOWN
  echo "no GPU baseline at $BASE: the gate did not run; the step summary says how to create one"
  exit 0
fi
# compare appends its summary to $GITHUB_STEP_SUMMARY itself; --summary keeps a copy for the PR comment
ditbench compare "$BASE" "$NEW" --policy "$POLICY" --summary "$(dirname "$NEW")/compare.md"
