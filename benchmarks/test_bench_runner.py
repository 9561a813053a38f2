"""pytest-benchmark: what the runner itself costs, figures the unit tests must not bound.

    PYTHONPATH=. pytest benchmarks/test_bench_runner.py --benchmark-autosave

- per-cell overhead: a 2-cell CPU suite (DiT-T/8, 64 px) run from scratch; the figures are the
  run's wall time and, per cell, the time outside the measured window (process start, imports,
  model build, warm-up, ticket and append);
- a hung cell: what a cell that hangs costs beyond its timeout (killing its process group);
- adoption: the next run's start when a killed run left 200 finished results in .inflight/.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from ditbench.bench import inflight
from ditbench.bench.launch.files import write_result
from ditbench.bench.runner import RunOptions, run_suite
from ditbench.spec.suite import load_suite

SUITE = """
name: bench_runner
device: cpu
defaults:
  model: DiT-T/8
  image_size: 64
  steps: {{warmup: 1, measure: 3, min_seconds: 0}}
  timeout_s: {timeout}
matrix: {{batch_size: {batches}}}
"""


def suite(tmp_path, batches="[1, 2]", timeout=3600):
    path = tmp_path / "bench_runner.yaml"
    path.write_text(textwrap.dedent(SUITE.format(batches=batches, timeout=timeout)))
    return load_suite(path)


def test_runner_overhead_per_cell(benchmark, tmp_path, monkeypatch):
    monkeypatch.delenv("DITBENCH_INJECT_FAULT", raising=False)
    s = suite(tmp_path)
    runs = iter(range(100))

    def run():
        out = tmp_path / f"out{next(runs)}"
        return run_suite(s, RunOptions(out=out, progress=False), echo=lambda _line: None)

    records = benchmark.pedantic(run, rounds=2, iterations=1)
    assert [r["status"] for r in records] == ["ok", "ok"]
    wall = benchmark.stats.stats.median
    window = sum(r["metrics"]["window_s"] for r in records)
    benchmark.extra_info.update(
        cells=len(records),
        run_s=wall,
        window_s=window,
        overhead_s_per_cell=(wall - window) / len(records),
        cell_duration_s=[r["duration_s"] for r in records],
    )


def test_a_hung_cell_costs_its_timeout_and_no_more(benchmark, tmp_path, monkeypatch):
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "bs=1=hang")
    timeout = 20.0
    s = suite(tmp_path, batches="[1]", timeout=timeout)
    runs = iter(range(100))

    def run():
        out = tmp_path / f"out{next(runs)}"
        return run_suite(s, RunOptions(out=out, progress=False), echo=lambda _line: None)

    (record,) = benchmark.pedantic(run, rounds=1, iterations=1)
    assert record["status"] == "timeout"
    benchmark.extra_info.update(
        timeout_s=timeout,
        cell_duration_s=record["duration_s"],
        beyond_timeout_s=record["duration_s"] - timeout,
    )


@pytest.mark.parametrize("n", [200])
def test_adopting_results_a_killed_run_left(benchmark, tmp_path, n):
    result = {
        "status": "ok",
        "metrics": {"images_per_s": 1.0, "step_ms": {"median": 1.0, "samples": [1.0] * 20}},
    }
    rounds = iter(range(100))

    def setup():
        out = tmp_path / f"out{next(rounds)}"
        folder = inflight.inflight_dir(out)
        for i in range(n):
            ticket = inflight.open_ticket(
                folder,
                {
                    "suite": "s",
                    "run_id": "r1",
                    "cell_id": f"{i:012x}",
                    "cell_name": f"cell {i}",
                    "suite_baseline": {},
                    "config": {"gpus": 1, "nodes": 1},
                    "started_at": "2026-01-01T00:00:00Z",
                },
            )
            write_result(ticket.result_path, result)
        return (out / "results.jsonl", folder, "r2"), {}

    t0 = time.perf_counter()
    adopted = benchmark.pedantic(inflight.adopt, setup=setup, rounds=3, iterations=1)
    assert len(adopted) == n
    benchmark.extra_info.update(results=n, total_s=time.perf_counter() - t0)
