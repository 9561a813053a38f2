"""The planner's per-rank memory against real two-rank DDP and FSDP2 runs on this CPU (gloo).

    python benchmarks/plan_vs_fsdp.py [--model DiT-S/2] [--write reports/plan_vs_cpu]

Measured: `torchrun --nproc-per-node 2` runs ditbench's Trainer as a cell does (dist.wrap_model: DDP, or
FSDP2 fully_shard on every block and the root) on gloo, and each rank reports the bytes its parameters,
gradients, AdamW state and EMA hold (the storages of its local tensors, padding included) after two
steps, and the CPU allocator's peak over its second step (profiler events, bench/cell/alloc_meter.py).
Predicted: `ditbench plan` for the same cell on the CPU with gpus 2 and that strategy (plan/parallel.py).
Target: every size within 2% of rank 0's, DDP's peak within 10% (FSDP's peak is reported: the
planner counts NCCL's buffers, and gloo's collectives copy more).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CELL = {"image_size": 64, "num_classes": 10, "batch_size": 4, "device": "cpu", "gpus": 2, "seed": 0}

RANK = """
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from ditbench.hardware import dist
from ditbench.bench.cell.alloc_meter import AllocationMeter
from ditbench.spec.knobs import Knobs
from ditbench.train.step import Trainer

def local(t):
    return t.to_local() if hasattr(t, "to_local") else t

def nbytes(tensors):
    seen = {}
    for t in tensors:
        if t is not None:
            st = local(t).untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())

ctx = dist.init("cpu")
knobs = Knobs(**json.loads(sys.argv[1]))
meter = AllocationMeter()
with meter:
    tr = Trainer(knobs, device="cpu", wrap_model=lambda m: dist.wrap_model(m, knobs.strategy, ctx))
    tr.step(tr.next_batch())
    with meter.window():
        tr.step(tr.next_batch())
params = list(tr.base_model.parameters())
state = [v for s in tr.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
ema = tr.ema._ema if tr.ema.model is None else list(tr.ema.model.parameters())
row = {"rank": ctx.rank, "weights": nbytes(params), "gradients": nbytes(p.grad for p in params),
       "optimizer": nbytes(state), "ema": nbytes(ema), "peak": meter.result().peak_bytes}
with open(sys.argv[2] + f".{ctx.rank}", "w") as f:
    json.dump(row, f)
dist.barrier(ctx)
dist.shutdown()
"""


def measure(cell: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(RANK)
        out = Path(tmp) / "row"
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        knobs = {k: v for k, v in cell.items() if k != "device"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(script), json.dumps(knobs), str(out)]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=900)
        return [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]


def predict(cell: dict) -> dict:
    from ditbench.plan.parallel import state_bytes
    from ditbench.plan.predict import predict_cell

    pred = predict_cell(cell)
    return {**state_bytes(cell), "peak": pred.peak_allocated_gib * 2**30}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="DiT-S/4")
    parser.add_argument("--write", type=Path, help="write fsdp.md and fsdp.json here")
    args = parser.parse_args()
    rows, misses = [], 0
    for strategy in ("ddp", "fsdp"):
        cell = {**CELL, "model": args.model, "strategy": strategy}
        measured, predicted = measure(cell), predict(cell)
        for part in ("weights", "gradients", "optimizer", "ema", "peak"):
            m = measured[0][part]
            err = 100 * (predicted[part] / m - 1) if m else None
            ok = err is not None and (
                abs(err) <= (10 if part == "peak" else 2) or (strategy, part) == ("fsdp", "peak")
            )
            misses += not ok
            rows.append({"strategy": strategy, "part": part, "rank0": m, "rank1": measured[1][part],
                         "predicted": round(predicted[part]), "error_pct": err, "within": ok})  # fmt: skip
    lines = [
        "| strategy | per rank | rank 0 MiB | rank 1 MiB | predicted MiB | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = "-" if r["error_pct"] is None else f"{r['error_pct']:+.2f}%"
        mib = " | ".join(f"{r[k] / 2**20:.3f}" for k in ("rank0", "rank1", "predicted"))
        lines.append(f"| {r['strategy']} | {r['part']} | {mib} | {err} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        args.write.mkdir(parents=True, exist_ok=True)
        doc = {"cell": {**CELL, "model": args.model}, "rows": rows}
        (args.write / "fsdp.json").write_text(json.dumps(doc, indent=1) + "\n")
        (args.write / "fsdp.md").write_text(
            f"# Per-rank memory: ditbench plan against 2-rank DDP and FSDP2 runs (gloo, CPU)\n\n"
            f"`python benchmarks/plan_vs_fsdp.py --model {args.model} --write {args.write}`: {args.model} at "
            f"{CELL['image_size']} px, batch {CELL['batch_size']} per rank, 2 ranks. Target:"
            f"{__doc__.split('Target:')[1]}"
            f"\n{text}\n"
        )
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
