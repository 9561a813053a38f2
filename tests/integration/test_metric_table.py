"""One metric table: a metric registered through `metrics.registry` alone reaches every reader.

A made-up metric (the mean of the samples' pool3 features) is registered here and nowhere else;
it then appears in `ditbench fid`'s JSON, in a quality run's record, in a `compare` verdict
(gated by the threshold its spec declares), in the report's quality tables and in claims.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from metrics_support import FakeExtractor
from synthetic_records import make_record, write_jsonl

from ditbench.cli import main
from ditbench.files.pretrained import CACHE_ENV
from ditbench.hardware.dist import DistContext
from ditbench.metrics import registry
from ditbench.metrics.spec import Metric, Need, Output
from ditbench.models import builtin_data
from ditbench.quality.loop import run_quality
from ditbench.records.metrics import table
from ditbench.report.claim_check import check_claims
from ditbench.report.claims import parse_claims
from ditbench.report.gate.decide import compare_files
from ditbench.report.gate.policy import load_policy
from ditbench.report.load import load_results
from ditbench.report.quality import quality_section
from ditbench.spec.cell import CellSpec, Steps
from ditbench.spec.knobs import Knobs
from ditbench.spec.quality import QualitySpec, Sampler

MEAN_POOL3 = Metric(
    name="meanpool",
    title="Mean pool3",
    sample_features=("pool3",),
    reference_keys=(),
    outputs=(Output("mean_pool3", "Mean pool3", "{:.5f}", "lower", valid="any", threshold_pct=1.0),),
    needs=lambda options: Need(1, 0, "a mean needs one sample"),
    compute=lambda inputs, options: {"mean_pool3": float(inputs.samples["pool3"].double().mean())},
)


@pytest.fixture
def registered():
    registry.register(MEAN_POOL3)
    yield
    registry.register(remove=MEAN_POOL3.name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("table")
    with np.load(builtin_data.resolve("builtin:mpl-gray16-ref")) as f:
        np.savez(root / "ref.npz", arr_0=f["arr_0"][:16])
    return root / "ref.npz"


def _quality_field(reference, tmp_path):
    from ditbench.bench.cell.core import build_trainer

    knobs = Knobs(
        model="DiT-T/2", image_size=64, batch_size=4, num_classes=2, data={"pixels": "builtin:mpl-gray16"}
    )
    quality = QualitySpec(
        str(reference), samples=6, sampler=Sampler("ddpm", 3, 1.5), at=(0,), seeds=(0, 1), grid=0
    )
    spec = CellSpec(knobs, "cpu", Steps(0, 1, 0.0), 0, quality=quality)
    ctx = DistContext(device=torch.device("cpu"))
    return run_quality(
        spec, ctx, build_trainer, smoke=None, out_dir=tmp_path, cell_id="c1", extractor=FakeExtractor()
    )


@pytest.mark.slow
def test_a_registered_metric_reaches_fid_the_quality_record_compare_and_the_report(
    registered, reference, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    # ditbench fid: the JSON carries it, and its option-free spec needs no flag
    out = tmp_path / "m.json"
    args = ["fid", "--samples", str(reference), "--ref", str(reference), "--metrics", "meanpool,fid"]
    assert main([*args, "--inception-weights", "test", "--out", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert set(result["metrics"]) == {"fid", "mean_pool3"}
    assert "Mean pool3" in capsys.readouterr().out

    # a quality run's record: per seed, mean over seeds and spread
    field = _quality_field(reference, tmp_path)
    assert field["status"] == "ok", field.get("reason")
    (e,) = field["evaluations"]
    seeds = [p["mean_pool3"] for p in e["per_seed"]]
    assert e["metrics"]["mean_pool3"] == pytest.approx(np.mean(seeds))
    assert e["spread"]["mean_pool3"] == pytest.approx(np.std(seeds, ddof=1))

    # compare: gated by the spec's own threshold and direction (lower is better)
    assert table()["mean_pool3"].direction == "lower"
    base = make_record("DiT-S/8", "fp32", "none", 8, images_per_s=400.0, sample_seed=1)
    base["quality"] = field
    new = copy.deepcopy(base)
    new["sample_seed"] = 2
    worse = new["quality"]["evaluations"][0]
    worse["metrics"]["mean_pool3"] += 1000 * abs(worse["metrics"]["mean_pool3"]) + 1.0
    write_jsonl(tmp_path / "base.jsonl", [base])
    write_jsonl(tmp_path / "new.jsonl", [new])
    gate = compare_files(tmp_path / "base.jsonl", tmp_path / "new.jsonl", load_policy(None))
    (delta,) = [d for c in gate.cells for d in c.metrics if d.metric == "mean_pool3"]
    assert (delta.verdict, delta.label, delta.threshold_pct) == ("regression", "Mean pool3", 1.0)
    assert gate.exit_code == 1

    # the report: a column of its own, in its own format, and claims may name it
    df = load_results(tmp_path / "base.jsonl")
    blocks, _ = quality_section(df)
    summary = next(b for b in blocks if "vs baseline" in getattr(b, "headers", []))
    column = summary.headers.index("Mean pool3")
    sd = np.std(seeds, ddof=1)  # in its own format, at most; two significant digits of the spread
    places = min(5, max(0, 1 - math.floor(math.log10(sd))))
    assert summary.rows[0][column] == f"{np.mean(seeds):.{places}f} ± {sd:.{places}f}"
    claim = {
        "says": "mean pool3 below 1e6",
        "cell": {"model": "DiT-S/8"},
        "metric": "mean_pool3",
        "at_most": 1e6,
    }
    (checked,) = check_claims(df, parse_claims({"claims": [claim]}, "c.yaml"), 1000)
    assert checked.verdict == "held" and checked.measured == f"{np.mean(seeds):.5f}"


def test_unregistering_restores_the_table():
    before = registry.METRICS
    registry.register(MEAN_POOL3)
    assert "mean_pool3" in table() and registry.ALL_METRICS[-1] == "meanpool"
    registry.register(remove="meanpool")
    assert registry.METRICS == before and "mean_pool3" not in table()
