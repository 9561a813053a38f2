"""The traces shipped with the package (ditbench/plan/traces.json.xz) are the traces the step makes now.

When one differs, the step allocates differently than when they were written: rerun
`python benchmarks/plan_traces.py` (and, as for any change to the step, the H200 report).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ditbench.plan import cache
from ditbench.plan.emulation import cuda_target
from ditbench.plan.predict import normalize, trace_key, trace_knobs
from ditbench.plan.trace import trace_series

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from plan_traces import shipped_cells  # noqa: E402

GPU = cuda_target(None)
STALE = "the shipped trace differs from a fresh one: rerun `python benchmarks/plan_traces.py`"


def _parts(cell):
    return trace_key(trace_knobs(normalize(cell), GPU), GPU)


def _fresh(cell):
    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    return trace_series(trace_knobs(normalize(cell), GPU), GPU)


def test_every_series_the_default_answer_searches_is_shipped_for_this_torch():
    if cache.torch_release() != cache.shipped_release():
        pytest.skip(f"the shipped traces are for torch {cache.shipped_release()}")
    missing = [c for c in shipped_cells() if cache.shipped(_parts(c)) is None]
    assert missing == [] and len(shipped_cells()) == 72


@pytest.mark.parametrize(
    "cell",
    [
        {"model": "DiT-S/2", "precision": "bf16", "grad_ckpt": "none", "grad_accum": 1},
        {"model": "DiT-B/2", "precision": "fp32", "grad_ckpt": "every_2", "grad_accum": 2},
    ],
)
def test_shipped_traces_equal_fresh_ones(cell):
    shipped = cache.shipped(_parts(cell))
    if shipped is None:
        pytest.skip(f"no shipped traces for torch {cache.torch_release()}")
    assert cache.encode(shipped) == cache.encode(_fresh(cell)), STALE


@pytest.mark.slow  # 72 traces: about a minute on 2 cores
def test_every_shipped_trace_equals_a_fresh_one():
    if cache.torch_release() != cache.shipped_release():
        pytest.skip("no shipped traces for this torch")
    stale = [c for c in shipped_cells() if cache.encode(cache.shipped(_parts(c))) != cache.encode(_fresh(c))]
    assert stale == [], STALE


def test_the_encoding_gives_back_the_trace_and_refuses_a_broken_one():
    series = _fresh({"model": "DiT-T/2", "image_size": 64, "precision": "bf16", "grad_accum": 2})
    back = cache.decode(cache.encode(series))
    assert back.trace == series.trace and (back.const, back.per_sample) == (series.const, series.per_sample)
    broken = cache.encode(series)
    broken["events"] = broken["events"][:-3] + [0, 0, 0]  # three allocations the sizes do not have
    assert cache.decode(broken) is None
    assert cache.decode({"events": "x"}) is None
