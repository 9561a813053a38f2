"""`ditbench run --executor local`: the whole submitit path on CPU (a one-process cell and a 2-rank
gloo cell whose ranks the job's tasks start), a submitter killed and rerun, Ctrl-C, a hung and a
failed rank. The records must look like the local runner's (same keys, statuses, cell ids)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("submitit")

from written_records import shape, written  # noqa: E402

from ditbench.bench.jobs import JOBS_DIR  # noqa: E402
from ditbench.records.jsonl import read_records  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def write_suite(tmp_path, matrix="gpus: [1, 2]", timeout_s=600) -> Path:
    text = f"""
    name: j
    device: cpu
    defaults:
      model: DiT-T/4
      image_size: 32
      batch_size: 2
      num_classes: 10
      steps: {{warmup: 1, measure: 3, min_seconds: 0}}
      timeout_s: {timeout_s}
    matrix: {{{matrix}}}
    """
    path = tmp_path / "j.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def env(**extra) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), out.get("PYTHONPATH")) if p)
    out.pop("DITBENCH_INJECT_FAULT", None)
    out.pop("DITBENCH_INJECT_FAULT_RANK", None)
    out.update(extra)
    return out


def command(suite: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ditbench", "run", str(suite), "--out", str(out), "--no-progress", *extra]


def wait_for(predicate, proc, what) -> None:
    """Poll until predicate() holds; no wall-clock bound (pytest-timeout stops a hung test)."""
    while not predicate():
        assert proc.poll() is None, f"the submitter ended before {what}: {proc.communicate()}"
        time.sleep(0.05)


def job_files(out: Path) -> list[Path]:
    return sorted((out / JOBS_DIR).glob("*.job.json"))


def processes_naming(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(text in part for part in proc.info.get("cmdline") or ()):
            found.append(proc)
    return found


def alive(pid: int, out: Path) -> str:
    """The submitter's state and every process naming `out` (pid, parent, state, command)."""
    found = []
    for proc in [psutil.Process(pid) if psutil.pid_exists(pid) else None, *processes_naming(str(out))]:
        try:
            if proc is not None:
                found.append(
                    f"{proc.pid} (parent {proc.ppid()}, {proc.status()}): {' '.join(proc.cmdline())[:160]}"
                )
        except psutil.Error:
            pass
    return "; ".join(found) or "no process left"


@pytest.mark.slow
def test_a_killed_submitter_is_rerun_and_the_records_match_a_local_run(tmp_path):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    first = subprocess.Popen(command(suite, out, "--executor", "local"), env=env(), stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: job_files(out), first, "it submitted the first cell")
    finally:
        first.kill()  # SIGKILL: no clean-up; the job it submitted runs on
        first.wait()
    job_id = json.loads(job_files(out)[0].read_text())["job_id"]
    assert psutil.pid_exists(int(job_id))  # the job outlived its submitter
    rerun = subprocess.run(
        command(suite, out, "--executor", "local"), env=env(), capture_output=True, text=True, timeout=850
    )
    assert rerun.returncode == 0, rerun.stderr
    assert f"waiting for job {job_id}" in rerun.stderr  # not submitted twice (progress: stderr)
    assert rerun.stderr.count("submitted 1 cell(s) to local") == 1  # only the cell never submitted
    records = read_records(out / "results.jsonl")
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert len({r["cell_id"] for r in records}) == 2
    picked, ran = records
    assert picked["adopted_by"] == ran["run_id"] != picked["run_id"]
    assert picked["config"]["gpus"] == 1 and ran["config"]["gpus"] == 2
    assert ran["metrics"]["world_size"] == 2 and ran["metrics"]["launcher"] == "submitit-local"
    assert ran["metrics"]["scaling_reference"]["cell_id"] == picked["cell_id"]
    assert not list((out / JOBS_DIR).glob("*.json"))
    # the same suite through the local runner: records of the same shape
    local_out = tmp_path / "local"
    done = subprocess.run(command(suite, local_out), env=env(), capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stderr
    assert sorted(map(shape, written(local_out))) == sorted(map(shape, written(out)))
    assert (out / "summary.md").read_text().count("| ok") == 2
    # and a third run has nothing to do
    again = subprocess.run(
        command(suite, out, "--executor", "local"), env=env(), capture_output=True, text=True
    )
    assert again.returncode == 0 and "cell(s) to local" not in again.stderr and "2 of 2" in again.stderr
    assert len(read_records(out / "results.jsonl")) == 2


@pytest.mark.slow
def test_repeats_run_round_robin_as_jobs_each_its_own_record(tmp_path):
    """The one suite loop under submitit's local executor: `--repeats 2` is two jobs per cell, round-robin,
    each repeat a record; a rerun finds every repeat ok and submits nothing."""
    suite, out = write_suite(tmp_path, matrix="batch_size: [1, 2], gpus: [1]"), tmp_path / "out"
    done = subprocess.run(
        command(suite, out, "--executor", "local", "--repeats", "2"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_records(out / "results.jsonl")
    assert [(r["config"]["batch_size"], r["repeat"], r["repeats"]) for r in records] == [
        (1, 1, 2), (2, 1, 2), (1, 2, 2), (2, 2, 2)
    ]  # fmt: skip
    assert all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    assert len({r["run_id"] for r in records}) == 1 and len({r["cell_id"] for r in records}) == 2
    assert done.stderr.count("submitted 1 cell(s) to local") == 4
    assert "[4/4] repeat 2/2 " in done.stderr and "3 runs" not in done.stderr
    assert (out / "summary.md").read_text().count("2 runs") == 2  # each cell: the median of its 2 repeats
    assert not list((out / JOBS_DIR).glob("*.json"))
    again = subprocess.run(
        command(suite, out, "--executor", "local", "--repeats", "2"),
        env=env(),
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0 and "4 of 4 cell repeats already ok" in again.stderr, again.stderr
    assert "submitted" not in again.stderr and len(read_records(out / "results.jsonl")) == 4


@pytest.mark.slow
def test_ctrl_c_cancels_the_suites_jobs_and_leaves_no_ticket_behind(tmp_path):
    suite, out = write_suite(tmp_path, matrix="gpus: [2]"), tmp_path / "out"
    submitter = subprocess.Popen(
        command(suite, out, "--executor", "local"),
        env=env(DITBENCH_INJECT_FAULT="gpus=2=hang"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: under a shell's background job (`pytest &`) SIGINT is ignored, the run
        # would inherit that and rightly ignore Ctrl-C (what hung this test under a backgrounded .ci/run)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    ranks = lambda: list((out / JOBS_DIR).glob("*.result.ranks/rank*.json"))  # noqa: E731

    def started():  # this run's ranks (their spec lies in `out`), not a rank another test left ending
        ours = processes_naming(str(out))
        return list((out / JOBS_DIR).glob("*.started.json")) and [
            p for p in processes_naming("launch.rank") if p in ours
        ]

    ended = False
    try:
        wait_for(started, submitter, "its job started the ranks")
        job_id = int(json.loads(job_files(out)[0].read_text())["job_id"])
        submitter.send_signal(signal.SIGINT)
        try:
            stdout, stderr = submitter.communicate(timeout=120)
            ended = True
        except subprocess.TimeoutExpired:  # say who was still alive, for the cause
            pytest.fail(f"120 s after Ctrl-C: {alive(submitter.pid, out)}")
    finally:
        if not ended:  # the test failed before the run and its pipes ended: nothing of it outlives it
            for proc in [submitter, *processes_naming(str(out))]:
                try:
                    proc.kill()
                except (OSError, psutil.Error):
                    pass
    assert submitter.returncode == 130, stderr
    assert f"cancelled 1 job(s): {job_id}" in stderr
    deadline = time.monotonic() + 60
    while (psutil.pid_exists(job_id) or processes_naming(str(out))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not psutil.pid_exists(job_id) and not processes_naming(str(out))  # no rank left behind
    assert not ranks()
    assert not list((out / JOBS_DIR).glob("*.ticket.json"))
    assert not (out / "results.jsonl").exists() or not read_records(out / "results.jsonl")


@pytest.mark.slow
def test_a_hung_rank_times_out_and_a_failed_rank_stops_its_peer(tmp_path):
    # an hour's timeout: rank 0, waiting in a collective for the failed rank 1, is stopped by its task
    # when rank 1's task reports the failure (as torchrun stops the peers); else this test hangs
    suite, out = write_suite(tmp_path, matrix="gpus: [2], batch_size: [2, 4]", timeout_s=3600), tmp_path / "o"
    faults = env(DITBENCH_INJECT_FAULT="bs=2 gpus=2=hang,bs=4 gpus=2=raise", DITBENCH_INJECT_FAULT_RANK="1")
    for cells, extra in (("bs=4", ()), ("bs=2", ("--timeout-s", "30"))):
        done = subprocess.run(
            command(suite, out, "--executor", "local", "--cells", cells, *extra),
            env=faults,
            capture_output=True,
            text=True,
            timeout=850,
        )
        assert done.returncode == 0, done.stderr
    by_batch = {r["config"]["batch_size"]: r for r in read_records(out / "results.jsonl")}
    hung, failed = by_batch[2], by_batch[4]
    assert (
        hung["status"] == "timeout" and "ran past its 30 s limit; all 2 ranks were stopped" in hung["reason"]
    )
    assert failed["status"] == "error" and failed["reason"].startswith("rank 1: ")  # the cause, not rank 0
    assert "injected" in failed["reason"].lower() or "RuntimeError" in (failed.get("traceback") or "")
    assert not processes_naming(str(out))


FAKE_SLURM = {
    # sbatch: run the batch script at once in the background, with the variables SLURM sets for a job
    "sbatch": r"""
        seen={seen}; id=$((4100 + $(ls $seen | grep -c 'sh$'))); cp "$1" $seen/$id.sh
        nodes=$(sed -n 's/^#SBATCH --nodes=//p' "$1"); per=$(sed -n 's/^#SBATCH --ntasks-per-node=//p' "$1")
        hosts=$(printf 'localhost,%.0s' $(seq $nodes)); export SLURM_JOB_NODELIST=${hosts%,}
        SLURM_JOB_ID=$id SLURM_NTASKS=$((nodes * per)) SLURM_JOB_NUM_NODES=$nodes SLURM_NTASKS_PER_NODE=$per \
          setsid bash "$1" > $seen/$id.batch.log 2>&1 < /dev/null &
        echo $! > $seen/$id.pid
        echo "Submitted batch job $id"
    """,
    # srun: one task per rank, each with its SLURM_PROCID / SLURM_LOCALID, output as --output says
    "srun": r"""
        out=/dev/null
        while [[ "$1" == --* ]]; do if [[ "$1" == --output ]]; then out="$2"; shift; fi; shift; done
        for ((i = 0; i < SLURM_NTASKS; i++)); do
          log=${out//%j/$SLURM_JOB_ID}; log=${log//%t/$i}
          SLURM_PROCID=$i SLURM_LOCALID=$((i % SLURM_NTASKS_PER_NODE)) \
            SLURM_NODEID=$((i / SLURM_NTASKS_PER_NODE)) "$@" >> "$log" 2>&1 &
        done
        wait
    """,
    "sacct": "echo 'JobID|State|NodeList'",  # no accounting: the submitter asks squeue
    "squeue": r"""
        while [ $# -gt 0 ]; do if [ "$1" = -j ]; then id=$2; fi; shift; done
        kill -0 $(cat {seen}/$id.pid) 2>/dev/null && echo RUNNING; exit 0
    """,
    "scancel": "exit 0",
}


@pytest.mark.slow
def test_two_rank_cells_through_sbatch_and_srun_take_their_ranks_from_slurm(tmp_path):
    """The SLURM path end to end on CPU: a fake sbatch runs submitit's batch script, a fake srun starts
    one task per rank with SLURM's variables; the ranks rendezvous through them (gloo), no torchrun.
    One cell has 2 ranks on a node, the other 1 rank on each of 2 "nodes" (both this machine)."""
    seen, bin_dir = tmp_path / "seen", tmp_path / "bin"
    seen.mkdir()
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + textwrap.dedent(body.replace("{seen}", str(seen))))
        (bin_dir / name).chmod(0o755)
    suite, out = write_suite(tmp_path, matrix="gpus: [2]"), tmp_path / "out"
    suite.write_text(suite.read_text() + "include:\n  - {gpus: 1, nodes: 2}\n")
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        command(suite, out, "--executor", "slurm", "--cluster", "partition=cpu"),
        env=env(PATH=path),
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    scripts = [p.read_text() for p in sorted(seen.glob("*.sh"))]
    assert len(scripts) == 2 and all("#SBATCH --partition=cpu" in text for text in scripts)
    assert {("--nodes=1" in t, "--ntasks-per-node=2" in t) for t in scripts} == {(True, True), (False, False)}
    records = {r["config"]["nodes"]: r for r in read_records(out / "results.jsonl")}
    for nodes, record in records.items():
        assert record["status"] == "ok", (record["reason"], record.get("traceback"))
        metrics = record["metrics"]
        assert metrics["launcher"] == "srun" and metrics["world_size"] == 2 and len(metrics["per_rank"]) == 2
        assert metrics["nodes"] == nodes
        assert record["env"] is not None  # the job's own environment
    assert sorted(records) == [1, 2]
    assert not list((out / JOBS_DIR).glob("*.json"))
