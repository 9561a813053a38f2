#!/usr/bin/env bash
# The one prepared GPU check: benchmarks/device_check.py (read its header), after installing the
# wheels carried in .whl/ (diffusers, for the sampling part) into /tmp/site.
#
#   benchmarks/gpu_all.sh [device_check.py options]       e.g. --parts matched,compiled
#
# How long: at most 570 s of checking (the deadline; the parts' caps add up to 560.5 s, variants runs
# on what they leave), plus ~5-10 s installing the wheels: on an H200 about 9.5 minutes, the parts
# taking 350-490 s and variants most of the rest. Give the device tool's run timeout_s=595 (its limit
# is 600) and carry [".whl"]; with the machine's start (1-2 minutes) the call uses about 12 of the
# session's 15 minutes, so no second full call fits: call give_back right after it. What it brings
# back even when cut: $OUT gets summary.md, summary.json, cells.jsonl, logs.tgz (4 of the 8 files the
# tool returns), rewritten after every part; they also go to reports/gpu/ (commit that folder).
#
# Before the call, here on the CPU (no device time): `python benchmarks/device_check.py --dry-run
# --parts preflight` takes seconds and says whether benchmarks/device_predictions.json is the planner
# code's; if not, `python benchmarks/device_predictions.py` remakes it (3 minutes on 2 busy cores) and
# the GPU call's preflight would refuse it in seconds anyway. Once, here, in the repo root:
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
