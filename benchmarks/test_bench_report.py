"""pytest-benchmark: reading, gating and checking claims on a few thousand result records, and
building a report.

Run with `pytest benchmarks/test_bench_report.py --benchmark-autosave` and compare later runs
with `--benchmark-compare --benchmark-compare-fail=mean:10%`. The records are synthetic but
shaped like real ones (20 per-step samples each, smoke curves on baseline cells).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from synthetic_records import MODELS, make_matrix, make_record, write_jsonl  # noqa: E402

from ditbench.report.gate.decide import compare_frames  # noqa: E402
from ditbench.report.load import load_results  # noqa: E402
from ditbench.report.render import build_report  # noqa: E402

N_RECORDS = 3000


def many_records(n: int, sample_offset: int = 0) -> list[dict]:
    combos = itertools.product(
        range(16),
        MODELS,
        ("fp32", "tf32", "bf16", "fp16"),
        ("none", "full"),
        (4, 8, 16, 32, 64, 128, 256, 512),
    )
    return [
        make_record(m, p, c, b, seed=seed, sample_seed=i + sample_offset)
        for i, (seed, m, p, c, b) in enumerate(itertools.islice(combos, n))
    ]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_report")
    base, new = tmp / "base.jsonl", tmp / "new.jsonl"
    write_jsonl(base, many_records(N_RECORDS))
    write_jsonl(new, many_records(N_RECORDS, sample_offset=100_000))  # same cells, fresh noise
    return base, new


def test_bench_load_results(benchmark, results):
    base, _ = results
    benchmark.extra_info["records"] = N_RECORDS
    benchmark.extra_info["bytes"] = base.stat().st_size
    df = benchmark(load_results, base)
    assert len(df) == N_RECORDS


def test_bench_compare(benchmark, results):
    base, new = (load_results(p) for p in results)
    benchmark.extra_info["cells"] = N_RECORDS
    result = benchmark(compare_frames, base, new)
    assert len(result.cells) == N_RECORDS and result.exit_code == 0


def test_bench_compare_with_regressions(benchmark, results, tmp_path):
    """Every cell 10% slower, so every cell runs its Mann-Whitney U test."""
    base = load_results(results[0])
    slow = []
    for r in base["record"]:
        img_s = r["metrics"]["images_per_s"] * 0.9
        slow.append(make_record(r["config"]["model"], config=r["config"], images_per_s=img_s, sample_seed=7))
    write_jsonl(tmp_path / "slow.jsonl", slow)
    new = load_results(tmp_path / "slow.jsonl")
    benchmark.extra_info["cells"] = N_RECORDS
    result = benchmark.pedantic(compare_frames, (base, new), rounds=3, iterations=1)
    assert result.count("regression") == N_RECORDS


def test_bench_build_report(benchmark, tmp_path):
    records = make_matrix(
        models=("DiT-B/8", "DiT-L/4", "DiT-XL/2"), batches=(8, 16, 32, 64), gpu_memory_gib=24
    )
    write_jsonl(tmp_path / "results.jsonl", records)
    df = load_results(tmp_path / "results.jsonl")
    benchmark.extra_info["cells"] = len(df)
    blocks, plots = benchmark.pedantic(build_report, (df,), rounds=3, iterations=1)
    assert len(plots) == 4 and blocks


def test_bench_check_claims(benchmark, results):
    """The shipped resource-guide claims (20) against every record; each claim scans the whole run."""
    from ditbench.report.claim_check import check_claims
    from ditbench.report.claims import load_claims

    df = load_results(results[0])
    claims = load_claims(Path(__file__).resolve().parents[1] / "claims" / "dit_resource_guide.yaml")
    benchmark.extra_info["cells"] = len(df)
    benchmark.extra_info["claims"] = len(claims.claims)
    out = benchmark.pedantic(check_claims, (df, claims, 400_000), rounds=3, iterations=1)
    assert len(out) == len(claims.claims)
    assert {r.verdict for r in out} == {"held", "not held", "not measured"}
