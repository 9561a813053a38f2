"""Write the traces shipped with the package (ditbench/plan/traces.json.xz): every series the default
answer (`ditbench plan --card CARD`) searches, so it traces nothing.

    python benchmarks/plan_traces.py            # rewrite them (about a minute on 2 cores)

The paper's four sizes at patch 2 x fp32 (tf32 shares it), bf16, fp16 x checkpointing none, every_2,
full x one micro-batch or several (accumulation), at the default knobs. tests/unit/test_plan_shipped.py
holds them equal to fresh traces; rerun this when it says they differ, or after a torch upgrade.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def shipped_cells() -> list[dict]:
    from ditbench.plan.answer import ANSWER_MODELS, CKPTS

    return [
        {"model": m, "precision": p, "grad_ckpt": c, "grad_accum": a}
        for m in ANSWER_MODELS
        for p in ("fp32", "bf16", "fp16")
        for c in CKPTS
        for a in (1, 2)
    ]


def main() -> int:
    from ditbench.plan import cache
    from ditbench.plan.emulation import cuda_target
    from ditbench.plan.predict import normalize, trace_key, trace_knobs
    from ditbench.plan.trace import trace_series

    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    target = cuda_target(None)
    start = time.perf_counter()
    traces = {}
    for cell in shipped_cells():
        knobs = trace_knobs(normalize(cell), target)
        traces[cache.key(trace_key(knobs, target), code=False)] = trace_series(knobs, target)
    cache.write_shipped(traces)
    size = cache.SHIPPED.stat().st_size
    print(f"{len(traces)} traces in {time.perf_counter() - start:.0f} s: {cache.SHIPPED} ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
