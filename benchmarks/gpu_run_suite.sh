#!/usr/bin/env bash
# Prepared device check for `ditbench run` (issue 3), for a session that has a GPU.
#   benchmarks/gpu_run_suite.sh [SUITE] [OUT]      (default suites/single_24gb.yaml, reports/<suite name>)
# Prints the environment and the matmul ceilings, runs the gpu-marked runner test, then the suite.
# The suite resumes: if the command is cut off, run the same line again and only unfinished cells run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SUITE=${1:-suites/single_24gb.yaml}
NAME=$(basename "$SUITE" .yaml)
OUT=${2:-reports/$NAME}
PY=${PYTHON:-python}
"$PY" -m ditbench env --measure-peak
"$PY" -m pytest tests/integration/test_runner.py -m gpu -q -p no:cacheprovider
"$PY" -m ditbench run "$SUITE" --out "$OUT" --no-progress
