"""The launcher interface: which launcher a cell gets, and what torchrun and srun share."""

from __future__ import annotations

from pathlib import Path

import pytest

from ditbench.bench.launch import base
from ditbench.bench.launch.process import MODULE, ONE_PROCESS, TORCHRUN, TORCHRUN_MODULE
from ditbench.spec.cell import CellSpec
from ditbench.spec.knobs import Knobs


def spec(device: str = "cpu", **knobs) -> CellSpec:
    return CellSpec(Knobs(model="DiT-T/8", image_size=64, **knobs), device)


@pytest.mark.parametrize(
    ("knobs", "launcher", "module"),
    [
        ({}, ONE_PROCESS, MODULE),
        ({"gpus": 2}, TORCHRUN, TORCHRUN_MODULE),
        ({"nodes": 2}, TORCHRUN, TORCHRUN_MODULE),  # one process per node is still several ranks
    ],
)
def test_a_cell_gets_one_process_or_torchrun_from_its_gpus_and_nodes(knobs, launcher, module):
    chosen = base.for_cell(spec(**knobs))
    assert chosen is launcher and chosen.module == module


def test_inside_a_submitit_job_the_jobs_tasks_start_the_ranks_and_one_process_stays_one():
    from ditbench.bench.launch.srun import JOB_RANKS

    assert base.for_cell(spec(gpus=2), ranks=JOB_RANKS) is JOB_RANKS
    assert base.for_cell(spec(nodes=2), ranks=JOB_RANKS) is JOB_RANKS
    assert base.for_cell(spec(), ranks=JOB_RANKS) is ONE_PROCESS


def test_the_ranks_reports_sit_beside_the_result_file():
    assert base.report_dir("/out/.inflight/abc.result.json") == Path("/out/.inflight/abc.result.ranks")


def test_cpu_ranks_with_threads_auto_share_the_cores_unless_the_user_set_the_threads(monkeypatch):
    monkeypatch.setattr(base.os, "cpu_count", lambda: 16)
    env: dict[str, str] = {}
    base.share_cores(env, spec(gpus=4, threads="auto"), 4, {})
    assert env == {"OMP_NUM_THREADS": "4"}
    env = {}
    base.share_cores(env, spec(gpus=32, threads="auto"), 32, {})
    assert env == {"OMP_NUM_THREADS": "1"}  # never 0
    env = {}
    base.share_cores(env, spec(gpus=4, threads="auto"), 4, {"OMP_NUM_THREADS": "2"})
    assert env == {}
    base.share_cores(env, spec("cuda", gpus=4), 4, {})
    assert env == {}  # GPU ranks keep torch's own thread count
