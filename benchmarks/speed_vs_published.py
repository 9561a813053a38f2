"""The planner's speed model against published DiT training speeds, on cards it was not fitted on.

    python benchmarks/speed_vs_published.py [--write]

Published figures (benchmarks/published_figures.yaml: card, model, precision, batch, GPUs,
checkpointing, VAE in the loop or latents, each with its source) are planned as the official step
runs them (zero_grad after the forward, torch's foreach AdamW, the VAE encoding every step when the
source trained from images, DDP over the GPUs). The calibration set is the H200 anchors
(benchmarks/h200_official_dit_anchor.jsonl) and the figures marked `calibrate`; every cell of it is
predicted by a fit without it (a published figure: without its card; an H200 anchor: without itself),
and the largest |error| of those is the band `ditbench plan` and `report --predict` give a speed. The
figures marked `holdout` are never fitted. Every figure is predicted by a fit without its card (the
H200's) and held to the band. Card rates: the datasheet's, or the sustained matmul rates measured where
the project has them (the H200's).
Goal: on cards not fitted, median |error| <= 8%, worst <= 20%, the band covering >= 80%.

--write regenerates the shipped calibration (ditbench/plan/speed_calibration.json: the fit on the whole
calibration set, the leave-one-card-out errors) and reports/plan_vs_published/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
FIGURES = ROOT / "benchmarks" / "published_figures.yaml"
REPORT = ROOT / "reports" / "plan_vs_published"
OFFICIAL = {"zero_grad": "after_forward", "optimizer_impl": "foreach"}


def figure_cells() -> list[tuple[dict, object]]:
    """(figure, speed.Cell) per published figure."""
    from ditbench.hardware.cards import DATASHEETS
    from ditbench.plan.emulation import cuda_target
    from ditbench.plan.predict import IMAGES, normalize, series_trace, trace_knobs
    from ditbench.plan.speed import Cell, blocks

    target = cuda_target(None)
    out = []
    for f in yaml.safe_load(FIGURES.read_text())["figures"]:
        config = {k: f[k] for k in ("model", "precision", "grad_ckpt", "batch_size", "gpus", "attention")}
        cell = normalize({**config, **OFFICIAL, **({"data": IMAGES} if f["images"] else {})})
        series = series_trace(trace_knobs(cell, target), target, disk=True)
        depth, ckpt_blocks = blocks(f["model"], f["grad_ckpt"])
        sheet = DATASHEETS[f["card"]]
        out.append((f, Cell(f["id"], series.trace.kernels, f["batch_size"], sheet, f["precision"], False,
                            f["steps_per_s"], gpus=f["gpus"], grad_bytes=4 * series.trace.params,
                            blocks=depth, ckpt_blocks=ckpt_blocks)))  # fmt: skip
    return out


def card_of(cell) -> str:
    from ditbench.hardware.cards import DATASHEETS

    return next(name for name, sheet in DATASHEETS.items() if sheet is cell.sheet)


def held_out(calibration: list, start: dict) -> list[dict]:
    """Each calibration cell predicted by a fit without it: a published figure by a fit without its card
    (leave one card out); an H200 anchor, whose card holds most of the set, by a fit without that cell
    (the A100's few figures cannot fit the model's parameters alone)."""
    from ditbench.plan.speed import fit, predict

    by_card: dict[str, dict] = {}
    out = []
    for i, c in enumerate(calibration):
        card = card_of(c)
        if card == "H200":
            params = fit(calibration[:i] + calibration[i + 1 :], start)
        else:
            if card not in by_card:
                by_card[card] = fit([x for x in calibration if card_of(x) != card], start)
            params = by_card[card]
        p = predict(c, params)
        err = 100 * (p / c.measured_steps_per_s - 1)
        out.append({"cell": c.name, "card": card, "measured_steps_per_s": c.measured_steps_per_s,
                    "predicted_steps_per_s": p, "error_pct": err})  # fmt: skip
    return out


KERNELS = REPORT / "kernels.json"


def save_cells(cells: list, path: Path = KERNELS) -> None:
    """The published figures' traced kernel rows, so the calibration can be refitted without tracing."""
    rows = [{"name": c.name, "card": card_of(c), "batch": c.batch, "precision": c.precision, "gpus": c.gpus,
             "grad_bytes": c.grad_bytes, "measured_steps_per_s": c.measured_steps_per_s, "blocks": c.blocks,
             "ckpt_blocks": c.ckpt_blocks, "kernels": [[*k, n] for k, n in sorted(c.kernels.items())]}
            for c in cells]  # fmt: skip
    path.write_text("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in rows) + "\n]\n")


def load_cells(path: Path = KERNELS) -> list:
    from ditbench.hardware.cards import DATASHEETS
    from ditbench.plan.speed import Cell

    return [Cell(r["name"], {(k[0], k[1], k[2], *k[3:7]): k[7] for k in r["kernels"]}, r["batch"],
                 DATASHEETS[r["card"]], r["precision"], False, r["measured_steps_per_s"], gpus=r["gpus"],
                 grad_bytes=r["grad_bytes"], blocks=r["blocks"], ckpt_blocks=r["ckpt_blocks"])
            for r in json.loads(path.read_text())]  # fmt: skip


def calibration_cells() -> list:
    """The calibration set from the committed kernel rows: the H200 anchors and the figures to fit."""
    from speed_vs_h200 import load_cells as h200_cells

    use = {f["id"]: f["use"] for f in yaml.safe_load(FIGURES.read_text())["figures"]}
    return h200_cells() + [c for c in load_cells() if use[c.name] == "calibrate"]


def main(argv: list[str] | None = None) -> int:
    from speed_vs_h200 import load_cells as h200_cells

    from ditbench.plan.speed import PARAMS, Calibration, fit, predict

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", action="store_true", help="regenerate the calibration and the report")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    published = figure_cells()
    if args.write:
        save_cells([c for _, c in published])
    start = {k: v[0] for k, v in PARAMS.items()}
    calibration = h200_cells() + [c for f, c in published if f["use"] == "calibrate"]
    loo = held_out(calibration, start)
    band = round(max(abs(r["error_pct"]) for r in loo), 1)
    params = fit(calibration, start)
    rows = []
    without: dict[str, dict] = {}
    keep = "id card gpus model attention precision grad_ckpt batch_size images use source".split()
    for f, c in published:  # each figure by a fit without its card
        if f["card"] not in without:
            without[f["card"]] = fit([x for x in calibration if card_of(x) != f["card"]], start)
        p = predict(c, without[f["card"]])
        err = 100 * (p / c.measured_steps_per_s - 1)
        rows.append({**{k: f[k] for k in keep}, "measured_steps_per_s": f["steps_per_s"],
                     "predicted_steps_per_s": p, "error_pct": err, "in_band": abs(err) <= band,
                     "predicted_all_steps_per_s": predict(c, params)})  # fmt: skip
    errors = [abs(r["error_pct"]) for r in rows]
    held = [r for r in rows if r["use"] == "holdout"]
    summary = {
        "band_pct": band,
        "figures": len(rows),
        "median_abs_error_pct": statistics.median(errors),
        "worst_abs_error_pct": max(errors),
        "coverage": sum(r["in_band"] for r in rows) / len(rows),
        "holdout_coverage": sum(r["in_band"] for r in held) / len(held),
    }
    lines = ["| figure | card x GPUs | cell | data | measured steps/s | predicted | error | in band |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['id']} ({r['use']}) | {r['card']} x {r['gpus']} | {r['model']} {r['precision']} "
            f"ckpt={r['grad_ckpt']} b{r['batch_size']} | {'images (VAE)' if r['images'] else 'latents'} | "
            f"{r['measured_steps_per_s']:.2f} | {r['predicted_steps_per_s']:.3f} | {r['error_pct']:+.1f}% | "
            f"{'yes' if r['in_band'] else 'no'} |"
        )
    line = (
        f"{len(rows)} published figures, each predicted by a fit without its card: median |error| "
        f"{summary['median_abs_error_pct']:.1f}%, worst {summary['worst_abs_error_pct']:.1f}%; the band "
        f"+-{band}% (the largest error of the {len(calibration)} calibration cells, each predicted without "
        "it) covers "
        f"{summary['coverage']:.0%} ({summary['holdout_coverage']:.0%} of the {len(held)} never fitted)"
    )
    print("\n".join(lines) + "\n\n" + line)
    if args.write:
        from ditbench.plan.speed import SHIPPED

        source = "H200 anchors + published A100 figures (benchmarks/speed_vs_published.py)"
        cal = Calibration(params, band, source, len(calibration), loo)
        kept = {k: v for k, v in json.loads(SHIPPED.read_text()).items() if k == "memory_errors_pct"}
        SHIPPED.write_text(json.dumps({**cal.to_dict(), **kept}, indent=1) + "\n")
        REPORT.mkdir(parents=True, exist_ok=True)
        (REPORT / "rows.json").write_text(
            json.dumps({"summary": summary, "rows": rows, "loo": loo}, indent=1) + "\n"
        )
        (REPORT / "README.md").write_text(
            "# ditbench plan's speed against published DiT training speeds\n\n"
            + __doc__.split("\n\n", 1)[1]
            + "\n"
            + "\n".join(lines)
            + "\n\n"
            + line
            + "\n"
        )
    ok = (
        summary["median_abs_error_pct"] <= 8
        and summary["worst_abs_error_pct"] <= 20
        and summary["coverage"] >= 0.8
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
