"""The report's quality section: per-cell FID/IS/P/R against the baseline with the gate's noise rule,
the grids one per row, FID against GPU-hours, "FID after X GPU-hours", and the advice check that fp16 /
bf16 / checkpointing do not change quality. Records are synthetic (milliseconds)."""

from __future__ import annotations

import numpy as np
from PIL import Image
from synthetic_records import make_record, write_jsonl

from ditbench.report import advice
from ditbench.report.load import load_results
from ditbench.report.quality import BANNER, compare_fid, quality_section
from ditbench.report.render import write_report

BASELINE = {"precision": "fp32", "grad_ckpt": "none"}


def evaluation(step, fid, fid_sd, gpu_s, grid=None):
    per = [
        {
            "seed": s,
            "fid": fid + d,
            "sfid": 9.0,
            "inception_score": 3.0,
            "precision": 0.5,
            "recall": 0.4,
            "kid": None,
        }
        for s, d in ((0, -fid_sd / 2**0.5), (1, fid_sd / 2**0.5))
    ]
    keys = ("fid", "sfid", "inception_score", "precision", "recall", "kid")
    return {
        "step": step,
        "train_wall_s": gpu_s,
        "train_gpu_s": gpu_s,
        "sample_s": 1.0,
        "score_s": 2.0,
        "seeds": [0, 1],
        "per_seed": per,
        "metrics": {k: (fid if k == "fid" else per[0][k]) for k in keys},
        "spread": {k: (fid_sd if k == "fid" else (None if k == "kid" else 0.0)) for k in keys},
        "grid": grid,
    }


def quality(*evaluations, official=False):
    return {
        "status": "ok",
        "reference": {"path": "builtin:mpl-gray16-ref", "digest": "sha256:ab"},
        "inception": {"name": "test", "sha256": "c" * 64, "official": official},
        "sampler": {"name": "ddim", "steps": 25, "cfg_scale": 1.0, "precision": "fp32"},
        "samples": 48,
        "seeds": [0, 1],
        "evaluations": list(evaluations),
    }


def record(precision, ckpt, q):
    r = make_record("DiT-S/8", precision, ckpt, 8, suite_baseline=BASELINE, device="cpu")
    r["quality"] = q
    return r


def frame(tmp_path, records):
    write_jsonl(tmp_path / "results.jsonl", records)
    return load_results(tmp_path / "results.jsonl")


def test_verdicts_use_the_gates_noise_rule():
    base = quality(evaluation(0, 300.0, 2.0, 0), evaluation(500, 100.0, 2.0, 60))
    assert compare_fid(base, quality(evaluation(500, 103.0, 2.0, 50))).text == "within noise"  # 3 < 2*2.83
    worse = compare_fid(base, quality(evaluation(500, 110.0, 2.0, 50)))
    assert worse.text == "worse" and worse.step == 500 and "+10.00" in worse.detail and "5.66" in worse.detail
    assert compare_fid(base, quality(evaluation(500, 90.0, 2.0, 50))).text == "better"
    other = quality(evaluation(500, 90.0, 2.0, 50))
    other["samples"] = 96
    assert compare_fid(base, other).text == "not comparable"  # made differently: never judged
    assert compare_fid(base, quality(evaluation(400, 90.0, 2.0, 50))).text == "not comparable"


def test_the_section_tables_figures_and_grids(tmp_path):
    grid = tmp_path / "grids" / "c" / "step0000500.png"
    grid.parent.mkdir(parents=True)
    Image.fromarray(np.full((20, 40, 3), 128, np.uint8)).save(grid)
    records = [
        record(
            "fp32",
            "none",
            quality(
                evaluation(0, 300.0, 2.0, 0), evaluation(500, 100.0, 2.0, 3600, "grids/c/step0000500.png")
            ),
        ),
        record("bf16", "none", quality(evaluation(0, 300.0, 2.0, 0), evaluation(500, 102.0, 2.0, 1800))),
        record("fp32", "full", quality(evaluation(0, 300.0, 2.0, 0), evaluation(500, 140.0, 2.0, 4600))),
    ]
    df = frame(tmp_path, records)
    blocks, figures = quality_section(df)
    text = "\n".join(str(b) for b in blocks)
    assert BANNER in text
    summary = next(
        b for b in blocks if getattr(b, "headers", [None])[0] == "cell" and "vs baseline" in b.headers
    )
    verdicts = [row[summary.headers.index("vs baseline")] for row in summary.rows]
    assert verdicts == ["baseline", "within noise", "worse"]
    hours = next(b for b in blocks if getattr(b, "headers", [""])[-1].startswith("after"))
    assert hours.headers[1:] == ["after 30 GPU-min", "after 1 GPU-h", "after 1.28 GPU-h"]
    # the bf16 cell reached step 500 within 30 GPU-minutes; the fp32 baseline only had step 0 then
    assert hours.rows[1][1].startswith("102.0 ± 2.0 (step 500)") and "(step 0)" in hours.rows[0][1]
    assert set(figures) == {"quality_gpu_hours.png", "quality_grids.png"}
    written = write_report(df, tmp_path / "report")
    assert (tmp_path / "report" / "quality_grids.png").is_file() and "quality_gpu_hours.png" in written
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Sample quality" in md and "within noise" in md and BANNER in md


def test_advice_check_quality_unchanged(tmp_path):
    same = [
        record("fp32", "none", quality(evaluation(500, 100.0, 2.0, 60))),
        record("bf16", "none", quality(evaluation(500, 101.0, 2.0, 50))),
        record("fp32", "full", quality(evaluation(500, 99.0, 2.0, 80))),
    ]
    check = advice.check_quality_unchanged(frame(tmp_path, same))
    assert check.claim == "fp16 / bf16 / checkpointing do not change quality after 500 steps"
    assert check.verdict == "held" and "bf16" in check.evidence and "checkpointing" in check.evidence
    changed = [same[0], record("bf16", "none", quality(evaluation(500, 130.0, 2.0, 50)))]
    assert advice.check_quality_unchanged(frame(tmp_path, changed)).verdict == "not held"
    plain = [make_record("DiT-S/8", p, "none", 8, suite_baseline=BASELINE) for p in ("fp32", "bf16")]
    assert advice.check_quality_unchanged(frame(tmp_path, plain)).verdict == "not measured"
    assert quality_section(frame(tmp_path, plain)) == ([], {})


def test_fid_after_x_gpu_hours_is_empty_for_a_cell_not_evaluated_yet(tmp_path):
    # no step-0 evaluations: at the bf16 cell's 50 GPU-s, the fp32 cell has no FID yet
    cells = [
        record("fp32", "none", quality(evaluation(500, 100.0, 2.0, 60))),
        record("bf16", "none", quality(evaluation(500, 101.0, 2.0, 50))),
    ]
    blocks, _ = quality_section(frame(tmp_path, cells))
    hours = next(b for b in blocks if getattr(b, "headers", [""])[-1].startswith("after"))
    assert hours.headers[1:] == ["after 50 GPU-s", "after 1 GPU-min"]
    assert hours.rows[0][1:] == ["—", "100.0 ± 2.0 (step 500)"]
    assert hours.rows[1][1:] == ["101.0 ± 2.0 (step 500)", "101.0 ± 2.0 (step 500)"]
