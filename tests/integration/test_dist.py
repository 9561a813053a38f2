"""Multi-process cells on CPU: torchrun + gloo, DDP/FSDP2 gradients, failures, aggregation."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import torch

from ditbench.bench.launch import aggregate as agg
from ditbench.bench.launch import torchrun as rz
from ditbench.bench.launch import torchrun as tr
from ditbench.core.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("DITBENCH_INJECT_FAULT", None)
    env.pop("DITBENCH_INJECT_FAULT_RANK", None)
    return env


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in (p.info["cmdline"] or [])) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


# --------------------------------------------------------------------------------------------
# Command line and rendezvous


def test_torchrun_command_single_node_is_standalone():
    cmd = tr.torchrun_command(4, ["spec.json", "out"], python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in cmd and "--nnodes=1" in cmd and "--standalone" in cmd
    assert "--max-restarts=0" in cmd
    assert cmd[-4:] == ["-m", "ditbench.bench.launch.rank", "spec.json", "out"]


def test_torchrun_command_multi_node_uses_c10d_rendezvous():
    rdzv = rz.Rendezvous(nnodes=2, node_rank=1, endpoint="node0:29500", run_id="job7")
    cmd = tr.torchrun_command(8, ["s", "o"], rdzv, python="py")
    assert "--standalone" not in cmd
    for flag in (
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29500",
        "--rdzv-id=job7",
        "--nproc-per-node=8",
    ):
        assert flag in cmd
    with_join = tr.torchrun_command(8, ["s", "o"], rdzv, python="py", join_timeout_s=1200)
    assert "--rdzv-conf=join_timeout=1200" in with_join


@pytest.mark.parametrize(
    "rdzv, words",
    [
        (rz.Rendezvous(nnodes=2), "--rdzv-endpoint"),
        (rz.Rendezvous(nnodes=2, node_rank=2, endpoint="h:1"), "--node-rank 2"),
        (rz.Rendezvous(nnodes=2, endpoint="hostonly"), "HOST:PORT"),
        (rz.Rendezvous(nnodes=0), "--nnodes 0"),
    ],
)
def test_bad_rendezvous_is_a_user_error(rdzv, words):
    with pytest.raises(UserError, match=words):
        rdzv.validate()


def test_multi_node_runs_one_node_cells_on_node_0_only():
    two = rz.Rendezvous(nnodes=2, node_rank=1, endpoint="h:1")
    assert rz.node_verdict({"nodes": 2}, two) is None
    assert rz.node_verdict({"nodes": 1}, two)[0] == "skipped"
    assert rz.node_verdict({"nodes": 1}, rz.Rendezvous(nnodes=2, node_rank=0, endpoint="h:1")) is None
    status, reason = rz.node_verdict({"nodes": 4}, two)
    assert status == "unsupported" and "--nnodes 4" in reason


# --------------------------------------------------------------------------------------------
# Aggregation


def _rank(ips, sps, mem, samples):
    return {
        "images_per_s": ips,
        "steps_per_s": sps,
        "peak_mem_allocated_gib": mem,
        "peak_mem_reserved_gib": mem + 1,
        "tflops_per_s": ips / 100,
        "params": 123,
        "step_ms": {"median": 0, "samples": samples},
        "mfu": {"value": ips / 1000, "peak_tflops": 989.0, "peak_basis": "x"},
    }


def test_aggregate_sums_throughput_takes_slowest_step_and_largest_memory():
    a = _rank(100.0, 10.0, 5.0, [10.0, 30.0, 10.0])
    b = _rank(80.0, 8.0, 7.0, [20.0, 10.0, 10.0])
    a["fits_budget"], b["fits_budget"] = True, False
    m = agg.aggregate([a, b], global_batch=20)
    assert m["fits_budget"] is False
    assert m["images_per_s"] == 180.0
    assert m["images_per_s_per_gpu"] == 90.0
    assert m["steps_per_s"] == 8.0
    assert m["peak_mem_allocated_gib"] == 7.0 and m["peak_mem_allocated_gib_sum"] == 12.0
    assert m["peak_mem_reserved_gib"] == 8.0 and m["peak_mem_reserved_gib_sum"] == 14.0
    assert m["step_ms"]["samples"] == [20.0, 30.0, 10.0]  # per step, the slowest rank
    assert m["step_ms"]["median"] == 20.0
    assert m["tflops_per_s"] == pytest.approx(1.8)
    assert m["mfu"]["value"] == pytest.approx(0.09)  # mean of 0.1 and 0.08
    assert m["world_size"] == 2 and m["global_batch"] == 20 and m["params"] == 123
    assert [r["rank"] for r in m["per_rank"]] == [0, 1]
    assert "other_cpu_share" not in m["noise"]  # ranks that measured no load: judged on their steps only
    a["load"] = {"load_1m_start": 1.0, "load_1m_end": 2.0, "other_cpu_share": 0.5, "cpus": 2}
    loaded = agg.aggregate([a, b], global_batch=20)  # rank 0's machine load decides
    assert loaded["noisy"] is True and loaded["noise"]["other_cpu_share"] == 0.5


def test_scaling_efficiency_against_the_same_cell_at_one_gpu():
    base = {"model": "DiT-B/4", "precision": "bf16", "batch_size": 32}
    one = {
        "status": "ok",
        "cell_id": "c1",
        "config": {**base, "gpus": 1, "nodes": 1, "global_batch": 32},
        "metrics": {"images_per_s": 100.0},
    }
    other_model = {
        "status": "ok",
        "config": {**base, "model": "DiT-XL/2", "gpus": 1, "nodes": 1},
        "metrics": {"images_per_s": 10.0},
    }
    rec = {
        "status": "ok",
        "config": {**base, "gpus": 4, "nodes": 1, "global_batch": 128, "strategy": "ddp"},
        "metrics": {"images_per_s": 360.0},
    }
    agg.add_scaling_efficiency(rec, [other_model, one])
    assert rec["metrics"]["scaling_efficiency"] == pytest.approx(0.9)
    assert rec["metrics"]["scaling_reference"]["cell_id"] == "c1"
    lonely = {"status": "ok", "config": {**base, "gpus": 2}, "metrics": {"images_per_s": 1.0}}
    agg.add_scaling_efficiency(lonely, [other_model])
    assert lonely["metrics"]["scaling_efficiency"] is None
    assert agg.scaling_efficiency(50.0, 2, None) is None


# --------------------------------------------------------------------------------------------
# Real 2-process runs (gloo)

GRAD_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from ditbench.hardware import dist
    from ditbench.models.diffusion import create_diffusion
    from ditbench.models import build_model

    def make(seed=0):
        torch.manual_seed(seed)
        model = build_model("DiT-T/2", image_size=32, num_classes=10, class_dropout_prob=0.0)
        with torch.no_grad():  # leave adaLN-Zero's zeros behind, so every weight gets a gradient
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        return model

    def global_batch(n=4):
        g = torch.Generator().manual_seed(1)
        return (torch.randn(n, 4, 4, 4, generator=g), torch.randint(0, 1000, (n,), generator=g),
                torch.randint(0, 10, (n,), generator=g), torch.randn(n, 4, 4, 4, generator=g))

    def grads(model, names, full):
        out = {}
        for name, p in zip(names, model.parameters()):
            if p.grad is not None:
                g = p.grad
                out[name] = (g.full_tensor() if full else g).detach().clone()
        return out

    if __name__ == "__main__":
        out_path = sys.argv[1]
        ctx = dist.init("cpu")
        diffusion = create_diffusion()
        x, t, y, noise = global_batch()
        per = len(x) // ctx.world_size
        mine = slice(ctx.rank * per, (ctx.rank + 1) * per)
        result = {"world_size": ctx.world_size}
        for strategy in ("ddp", "fsdp"):
            model = make()
            names = [n for n, _ in model.named_parameters()]
            wrapped = dist.wrap_model(model, strategy, ctx)
            loss = diffusion.training_losses(wrapped, x[mine], t[mine], {"y": y[mine]}, noise=noise[mine])
            loss["loss"].mean().backward()
            result[strategy] = grads(dist.unwrap_model(wrapped), names, full=strategy == "fsdp")
        # Whole training steps as a cell runs them (FSDP: optimizer and EMA rebuilt on the shards).
        from ditbench.bench.cell.core import build_trainer
        from ditbench.spec.cell import CellSpec
        from ditbench.spec.knobs import Knobs
        for strategy in ("ddp", "fsdp"):
            knobs = Knobs(model="DiT-T/8", image_size=64, batch_size=2, num_classes=10, lr=1e-3, gpus=2,
                               strategy=strategy)
            tr = build_trainer(CellSpec(knobs, "cpu"), ctx)
            losses = [float(tr.step(tr.next_batch())) for _ in range(3)]
            full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
            params = [full(p.detach()).clone() for p in tr.base_model.parameters()]
            emas = tr.ema._ema if hasattr(tr.ema, "_ema") else list(tr.ema.model.parameters())
            result["train_" + strategy] = {"losses": losses, "params": params,
                                           "ema": [full(e).clone() for e in emas]}
        if ctx.is_main:
            torch.save(result, out_path)
        dist.barrier(ctx)
        dist.shutdown()
""")


@pytest.mark.slow
def test_ddp_and_fsdp_gradients_over_two_processes_equal_single_process(tmp_path):
    script = tmp_path / "grads.py"
    script.write_text(GRAD_SCRIPT)
    out = tmp_path / "grads.pt"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
        str(out),
    ]
    res = tr.launch(cmd, tmp_path / "launch", timeout_s=120, env=_env())
    assert res.returncode == 0, res.output_tail
    got = torch.load(out, weights_only=True)
    assert got["world_size"] == 2

    # The same model on the whole global batch, in this process, without any wrapper.
    sys.path.insert(0, str(tmp_path))
    try:
        import grads as ref_mod
    finally:
        sys.path.remove(str(tmp_path))
    from ditbench.models.diffusion import create_diffusion

    model = ref_mod.make()
    x, t, y, noise = ref_mod.global_batch()
    create_diffusion().training_losses(model, x, t, {"y": y}, noise=noise)["loss"].mean().backward()
    ref = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert len(ref) > 40  # every block's weights take part
    # DDP and FSDP2 training steps agree: losses, updated weights and EMA.
    ddp, fsdp = got["train_ddp"], got["train_fsdp"]
    assert ddp["losses"] == pytest.approx(fsdp["losses"], rel=1e-5)
    for a, b in zip(ddp["params"] + ddp["ema"], fsdp["params"] + fsdp["ema"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for strategy in ("ddp", "fsdp"):
        assert set(got[strategy]) == set(ref), strategy
        for name, g in ref.items():
            torch.testing.assert_close(
                got[strategy][name],
                g,
                rtol=1e-4,
                atol=1e-6,
                msg=lambda m, s=strategy, n=name: f"{s} {n}: {m}",
            )


def _spec(tmp_path: Path, smoke_steps: int = 0) -> Path:
    from ditbench.spec.cell import CellSpec, Steps
    from ditbench.spec.knobs import Knobs

    knobs = Knobs(model="DiT-T/8", image_size=64, batch_size=4, gpus=2, num_classes=10)
    spec = CellSpec(knobs, "cpu", Steps(warmup=1, measure=3, min_seconds=0.0), smoke_steps=smoke_steps)
    path = tmp_path / "cell.spec.json"
    path.write_text(
        json.dumps(
            {
                "cell_id": "t" + tmp_path.name[-8:],
                "cell_name": "DiT-T/8 gpus=2",
                "config": spec.model_dump(mode="json"),
            }
        )
    )
    return path


@pytest.mark.slow
def test_failing_rank_fails_the_cell_with_its_own_error_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "gpus=2=raise@2")
    monkeypatch.setenv("DITBENCH_INJECT_FAULT_RANK", "1")
    spec = _spec(tmp_path)
    result = tr.run_cell(spec, tmp_path / "cell.result.json", timeout_s=120)
    assert result["status"] == "error"
    assert result["reason"].startswith("rank 1: RuntimeError: injected fault")
    assert "raise at step 2" in result["traceback"]
    assert _processes_mentioning(str(spec)) == []


@pytest.mark.slow
def test_a_two_process_cell_with_a_smoke_run_and_a_rank_whose_smoke_run_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    monkeypatch.delenv("DITBENCH_INJECT_FAULT", raising=False)
    spec = _spec(tmp_path, smoke_steps=3)
    result = tr.run_cell(spec, tmp_path / "cell.result.json", timeout_s=300)
    assert result["status"] == "ok" and result["reason"] is None, result
    assert result["metrics"]["world_size"] == 2 and result["metrics"]["measured_steps"] == 3
    assert result["smoke"]["status"] == "ok" and len(result["smoke"]["loss"]) == 3
    # 1 warm-up + 3 measured steps, so step 6 is the smoke run's second: rank 1 raises there
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "gpus=2=raise@6")
    monkeypatch.setenv("DITBENCH_INJECT_FAULT_RANK", "1")
    result = tr.run_cell(spec, tmp_path / "cell.result.json", timeout_s=300)
    assert result["status"] == "ok" and result["metrics"]["measured_steps"] == 3, result
    smoke = result["smoke"]
    assert smoke["status"] == "error" and smoke["reason"].startswith("rank 1: RuntimeError: injected fault")
    assert _processes_mentioning(str(spec)) == []


@pytest.mark.slow
def test_hung_rank_times_out_and_every_process_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "gpus=2=hang@2")
    monkeypatch.setenv("DITBENCH_INJECT_FAULT_RANK", "0")
    spec = _spec(tmp_path)
    result = tr.run_cell(spec, tmp_path / "cell.result.json", timeout_s=10)
    assert result["status"] == "timeout", result
    assert "no process was left running" in result["reason"]
    assert _processes_mentioning(str(spec)) == []


SUITE = """
name: t_multi
description: a 1-process and a 2-process gloo cell of the same tiny DiT
device: cpu
defaults:
  image_size: 64
  batch_size: 2
  num_classes: 10
  steps: {warmup: 1, measure: 3, min_seconds: 0}
  timeout_s: 180
matrix:
  model: [DiT-T/8]
  gpus: [1, 2]
include:
  - {model: DiT-T/8, gpus: 2, strategy: fsdp}
"""


@pytest.mark.slow
def test_runner_runs_a_two_process_cell_through_torchrun_with_scaling_efficiency(tmp_path):
    from ditbench.bench.runner import RunOptions, run_suite
    from ditbench.spec.suite import load_suite

    path = tmp_path / "t_multi.yaml"
    path.write_text(SUITE)
    records = run_suite(
        load_suite(str(path)), RunOptions(out=tmp_path / "out", progress=False), echo=lambda _: None
    )
    assert [r["status"] for r in records] == ["ok"] * 3, [r.get("reason") for r in records]
    one, two, fsdp = sorted(records, key=lambda r: (r["config"]["gpus"], r["config"]["strategy"]))
    m = two["metrics"]
    assert m["world_size"] == 2 and m["launcher"] == "torchrun" and m["backend"] == "gloo"
    assert two["config"]["global_batch"] == m["global_batch"] == 4
    # unset `threads`: one torch thread per CPU process, one-process cell and ranks alike
    assert (
        m["threads_per_rank"] == 1 and one["env"]["torch_threads"] == 1 and one["config"]["threads"] is None
    )
    assert 0.0 <= m["load"]["other_cpu_share"] <= 1.0 and m["noise"]["load_bound"] == 0.25
    assert m["scaling_reference"]["cell_id"] == one["cell_id"]
    expected = m["images_per_s"] / (2 * one["metrics"]["images_per_s"])
    assert m["scaling_efficiency"] == pytest.approx(expected) and m["scaling_efficiency"] > 0
    assert "gpus=2" in (tmp_path / "out" / "summary.md").read_text()
    # FSDP2: sharded parameters, optimizer and EMA rebuilt after wrapping; the same record shape.
    f = fsdp["metrics"]
    assert f["strategy"] == "fsdp" and f["world_size"] == 2 and len(f["per_rank"]) == 2
    assert f["images_per_s"] == pytest.approx(sum(r["images_per_s"] for r in f["per_rank"]))
    assert f["measured_steps"] == 3 and len(f["step_ms"]["samples"]) == 3
    assert f["scaling_reference"]["cell_id"] == one["cell_id"]


def test_run_refuses_several_nodes_without_an_endpoint(tmp_path, capsys):
    from ditbench.cli import main

    path = tmp_path / "t_multi.yaml"
    path.write_text(SUITE)
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--nnodes", "2"]) == 2
    assert "--rdzv-endpoint HOST:PORT" in capsys.readouterr().err


@pytest.mark.slow
def test_two_nodes_on_one_machine_rendezvous_and_node_0_records_the_cell(tmp_path):
    """Two `ditbench run` processes as two nodes (c10d rendezvous on localhost), 1 rank each."""
    import socket
    import subprocess

    path = tmp_path / "t_nodes.yaml"
    path.write_text(SUITE.replace("gpus: [1, 2]", "nodes: [2]").split("include:")[0])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def node(rank):
        cmd = [
            sys.executable,
            "-m",
            "ditbench",
            "run",
            str(path),
            "--out",
            str(tmp_path / f"n{rank}"),
            "--no-progress",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
        ]
        return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = [node(0), node(1)]
    outs = [p.communicate()[0] for p in procs]  # no wall-clock bound: pytest-timeout stops a hang
    assert [p.returncode for p in procs] == [0, 0], outs
    rec0, rec1 = (
        json.loads((tmp_path / f"n{r}" / "results.jsonl").read_text().splitlines()[0]) for r in (0, 1)
    )
    assert rec0["status"] == "ok", rec0.get("reason")
    assert rec0["metrics"]["world_size"] == 2 and rec0["metrics"]["nodes"] == 2
    assert rec0["config"]["global_batch"] == rec0["metrics"]["global_batch"] == 4
    assert rec1["status"] == "skipped" and "node 0 records" in rec1["reason"]


def _launch_result(returncode, reports, gathered_ranks):
    from ditbench.bench.launch.torchrun import LaunchResult

    gathered = {"metrics": [{} for _ in range(gathered_ranks)]} if gathered_ranks else None
    tail = "terminate called without an active exception"
    return LaunchResult(returncode, False, 1.0, tail, reports, gathered)


def test_judge_a_crash_at_teardown_after_complete_reports_keeps_the_measurement():
    from ditbench.bench.launch.torchrun import judge

    ok = {0: {"rank": 0, "status": "ok"}, 1: {"rank": 1, "status": "ok"}}
    status, reason = judge(_launch_result(-6, ok, 2), world_size=2, timeout_s=60)
    assert status == "ok" and "exited with code -6" in reason and "measurement is complete" in reason
    assert judge(_launch_result(0, ok, 2), world_size=2, timeout_s=60) == ("ok", None)


def test_judge_a_crash_before_every_rank_reported_is_an_error():
    from ditbench.bench.launch.torchrun import judge

    ok = {0: {"rank": 0, "status": "ok"}}
    status, reason = judge(_launch_result(-6, ok, 0), world_size=2, timeout_s=60)
    assert status == "error" and "crashed hard" in reason
    status, _ = judge(_launch_result(-6, {}, 0), world_size=2, timeout_s=60)
    assert status == "error"


def test_judge_a_cell_that_reached_its_limit_is_a_timeout_whatever_its_peers_report_after():
    """The race of a hung rank: once the limit stops it, its peer fails on the broken collective and
    reports an error; that report comes after the limit, so the cell is `timeout` (every launcher
    judges through here). A rank that failed before the limit is still the cause."""
    from dataclasses import replace

    from ditbench.bench.launch.torchrun import judge, result_of_launch

    limit = 1_000.0
    peer = {
        0: {"rank": 0, "status": "error", "reason": "Connection closed by peer", "failed_at": limit + 0.5}
    }
    hung = replace(_launch_result(1, peer, 0), timed_out=True, timed_out_at=limit)
    status, reason = judge(hung, world_size=2, timeout_s=30)
    assert status == "timeout" and "ran past its 30 s limit; all 2 ranks were stopped" in reason

    cause = {1: {"rank": 1, "status": "error", "reason": "injected", "failed_at": limit - 5.0}}
    failed = replace(_launch_result(1, {**peer, **cause}, 0), timed_out=True, timed_out_at=limit)
    assert judge(failed, world_size=2, timeout_s=30) == (
        "error",
        "rank 1: injected (rank(s) 0 failed after it)",
    )

    class Spec:  # what result_of_launch reads of a failed cell
        world_size = 2

    assert result_of_launch(hung, Spec(), 30)["status"] == "timeout"
