#!/usr/bin/env bash
# The one prepared GPU check: benchmarks/device_check.py (read its header), after installing the
# wheels carried in .whl/ (diffusers, for the sampling part) into /tmp/site.
#
#   benchmarks/gpu_all.sh [device_check.py options]       e.g. --deadline 480, --parts matched,compiled
#
# Figures go to reports/gpu/ (summary.md, summary.json, cells.jsonl, logs.tgz) and to $OUT when it is
# set, after every part. Once, on the machine that prepares the call, in the repo root:
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl diffusers==0.42.1 importlib_metadata
# (.whl/ is git-ignored) and name .whl in the device call's carry.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" \
    || echo "gpu_all.sh: installing .whl/ failed; parts that need those packages will say unsupported" >&2
fi
export PYTHONUNBUFFERED=1
exec "$PY" benchmarks/device_check.py "$@"
