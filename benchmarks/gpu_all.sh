#!/usr/bin/env bash
# The one prepared GPU check: everything ditbench measures on a CUDA card, in one call of under
# 10 minutes on one H200, figures written under reports/gpu/ (and copied to $OUT when it is set).
#
#   benchmarks/gpu_all.sh [PARTS]     PARTS: comma list of tests,matrix,suite,fid,sample (default: all)
#
# Each part has its own time cap and writes its results as it goes (the matrix JSON after every cell,
# the suite's results.jsonl after every cell), so a part cut off by its cap keeps what it measured and
# the same command resumes the suite. Order = priority: the cheapest and most asked-for figures first.
#
# On a machine whose python lacks diffusers (needed for the VAE when sampling), carry it as wheels:
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl diffusers==0.42.1 importlib_metadata
# and name .whl in the device call's carry: this script installs what it finds there.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
PARTS=${1:-tests,matrix,suite,fid,sample}
mkdir -p reports/gpu
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)" \
  || { echo "gpu_all.sh: no CUDA device visible; this script is for a GPU machine" >&2; exit 2; }

status=0
part() {  # part NAME SECONDS COMMAND...: run one part under its cap, note how it ended
  local name=$1 cap=$2; shift 2
  case ",$PARTS," in *",$name,"*) ;; *) return 0 ;; esac
  echo "=== $name (cap ${cap}s) $(date -u +%H:%M:%S)"
  timeout --kill-after=10 "$cap" "$@" 2>&1 | tee "reports/gpu/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name ended with $rc"
  [ "$rc" -eq 0 ] || status=1
}

"$PY" -m ditbench env --measure-peak --json > reports/gpu/env.json || status=1
# only the files with gpu-marked tests: others import packages (torch_fidelity) the GPU image may lack
part tests  60  "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py tests/test_runner.py
part matrix 200 "$PY" benchmarks/gpu_train_matrix.py --budget 170 --cell-timeout 90 --out reports/gpu/train_matrix.json
part suite  170 "$PY" -m ditbench run suites/single_24gb.yaml --out reports/single_24gb --no-progress
part fid    60  "$PY" benchmarks/gpu_fid.py --out reports/gpu/fid.json
part sample 60  "$PY" benchmarks/gpu_dist_sample.py --out reports/gpu/dist_sample.json

if [ -f reports/single_24gb/results.jsonl ]; then
  "$PY" -m ditbench report reports/single_24gb/results.jsonl --out reports/single_24gb || status=1
fi
if [ -n "${OUT:-}" ]; then  # the device tool brings back at most 8 files
  cp reports/gpu/env.json reports/gpu/*.json "$OUT"/ 2>/dev/null
  cp reports/single_24gb/results.jsonl "$OUT"/single_24gb_results.jsonl 2>/dev/null
  tar czf "$OUT"/logs.tgz reports/gpu/*.log reports/single_24gb 2>/dev/null
fi
exit $status
