"""`ditbench run --executor slurm` on a live two-node SLURM cluster (tests/cluster/slurm.sh): arrays,
one- and two-node gloo cells, a time limit, scancel, a requeue, a killed submitter, and sacct's lag.

Skipped with the reason when no cluster answers (tests/support/slurm_cluster.py). The cells are
cpu_multi's, cut to 1 warm-up and 2 measured steps at 32 px so that the whole file stays within a
few minutes on two cores. Each test has its own deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("submitit")

from written_records import shape, written  # noqa: E402

from ditbench.bench.jobs import JOBS_DIR  # noqa: E402
from ditbench.bench.launch import executors  # noqa: E402
from ditbench.records.jsonl import read_records  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SMALL = ["steps.warmup=1", "steps.measure=2", "steps.min_seconds=0", "image_size=32"]


def env(**extra) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), out.get("PYTHONPATH")) if p)
    out.setdefault("OMP_NUM_THREADS", "1")
    for key in ("DITBENCH_INJECT_FAULT", "DITBENCH_INJECT_FAULT_RANK"):
        out.pop(key, None)
    out.update(extra)
    return out


def run(suite: str, out: Path, *extra: str, timeout: float = 300, **env_extra) -> subprocess.CompletedProcess:
    """`ditbench run`; its stdout holds what a user sees, the progress lines (stderr) among it."""
    done = subprocess.run(
        [sys.executable, "-m", "ditbench", "run", suite, "--out", str(out), "--no-progress", *extra],
        env=env(**env_extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout
    return done


def start(suite: str, out: Path, *extra: str, **env_extra) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ditbench", "run", suite, "--out", str(out), "--no-progress", *extra],
        env=env(**env_extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def write_suite(tmp_path: Path, matrix: str, timeout_s: int = 300, extra: str = "") -> str:
    text = f"""
    name: live
    device: cpu
    defaults:
      model: DiT-T/4
      image_size: 32
      batch_size: 4
      num_classes: 10
      steps: {{warmup: 1, measure: 2, min_seconds: 0}}
      timeout_s: {timeout_s}
    matrix: {{{matrix}}}
    """
    path = tmp_path / "live.yaml"
    path.write_text(textwrap.dedent(text) + extra)
    return str(path)


def records(out: Path) -> list[dict]:
    return read_records(out / "results.jsonl")


def by_name(out: Path) -> dict[str, dict]:
    return {r["cell_name"]: r for r in records(out)}


def jobs_dir(out: Path) -> Path:
    return out / JOBS_DIR


def job_ids(out: Path) -> dict[str, str]:
    """cell id -> job id, from the job files of the cells still waited for."""
    found = {}
    for path in jobs_dir(out).glob("*.job.json"):
        found[path.name.split(".")[0]] = json.loads(path.read_text())["job_id"]
    return found


def slurm_state(job_id: str) -> str:
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return done.stdout.strip()


def wait_until(predicate, what: str, proc: subprocess.Popen | None = None) -> None:
    """Poll; the test's own deadline (pytest-timeout) bounds the wait."""
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the submitter ended before {what}: {proc.stdout.read()}")
        time.sleep(0.5)


def submitted_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("submitted ")]


@pytest.mark.timeout(420)
def test_cpu_multi_runs_as_one_array_per_job_shape_and_matches_a_local_run(tmp_path):
    out, local = tmp_path / "slurm", tmp_path / "local"
    # the local run goes alongside (only the records' shape is compared): the submitter mostly waits
    local_run = start("cpu_multi", local, *SMALL)
    try:
        done = run("cpu_multi", out, *SMALL, "--executor", "slurm")
        local_out, _ = local_run.communicate(timeout=300)
    finally:
        if local_run.poll() is None:
            local_run.kill()
    assert local_run.returncode == 0, local_out
    lines = submitted_lines(done.stdout)
    # one job for the 1-rank cell, one array of two for the 2-rank DDP and FSDP cells
    assert sorted(line.split(":")[0] for line in lines) == [
        "submitted 1 cell(s) to slurm",
        "submitted 2 cell(s) to slurm",
    ], done.stdout
    array_line = next(line for line in lines if line.startswith("submitted 2"))
    array_ids = array_line.split("job(s) ")[1].split(", ")
    assert len({i.split("_")[0] for i in array_ids}) == 1 and {i.split("_")[1] for i in array_ids} == {
        "0",
        "1",
    }
    got = records(out)
    assert [r["status"] for r in got] == ["ok", "ok", "ok"], [(r["status"], r.get("reason")) for r in got]
    for record in got:
        nodes = record["slurm_job"]["nodes"]
        assert len(nodes) == 1 and nodes[0] in ("node1", "node2"), record["slurm_job"]
        if record["config"]["gpus"] == 2:
            assert record["metrics"]["launcher"] == "srun" and len(record["metrics"]["per_rank"]) == 2
    ignore = ("adopted_by", "slurm_job")
    assert sorted(shape(r, ignore) for r in written(out)) == sorted(shape(r, ignore) for r in written(local))
    ended_completed([r["slurm_job"]["id"] for r in got])


@pytest.mark.timeout(300)
def test_a_two_node_gloo_cell_runs_through_srun_on_node1_and_node2(tmp_path):
    out, suite = tmp_path / "o", write_suite(tmp_path, "gpus: [1], nodes: [2]")
    run(suite, out, "--executor", "slurm")
    (record,) = records(out)
    assert record["status"] == "ok", (record.get("reason"), record.get("traceback"))
    assert record["slurm_job"]["nodes"] == ["node1", "node2"]
    assert record["config"]["nodes"] == 2 and record["metrics"]["world_size"] == 2
    assert record["metrics"]["launcher"] == "srun" and len(record["metrics"]["per_rank"]) == 2
    job = record["slurm_job"]["id"]
    ended_completed([job])
    run(suite, out, "--executor", "slurm")  # nothing to run; the ended job's submitit folder goes
    assert not (jobs_dir(out) / executors.SUBMITIT_DIR / job).exists() and len(records(out)) == 1


@pytest.mark.timeout(300)
def test_repeats_are_one_array_each_repeat_a_record_and_every_job_ends_completed(tmp_path):
    """`--repeats 2` under SLURM: the suite loop submits each cell's two repeats (one array for the
    one job shape); each repeat is its own record, and every job that wrote one ends COMPLETED."""
    out, suite = tmp_path / "o", write_suite(tmp_path, "batch_size: [2, 3]")
    done = run(suite, out, "--executor", "slurm", "--repeats", "2")
    assert [line.split(":")[0] for line in submitted_lines(done.stdout)] == ["submitted 4 cell(s) to slurm"]
    got = records(out)
    assert sorted((r["config"]["batch_size"], r["repeat"], r["repeats"]) for r in got) == [
        (2, 1, 2), (2, 2, 2), (3, 1, 2), (3, 2, 2)
    ], [(r["status"], r.get("reason")) for r in got]  # fmt: skip
    assert [r["status"] for r in got] == ["ok"] * 4, [r.get("reason") for r in got]
    assert len({r["run_id"] for r in got}) == 1
    ended_completed([r["slurm_job"]["id"] for r in got])
    again = run(suite, out, "--executor", "slurm", "--repeats", "2")
    assert "4 of 4 cell repeats already ok" in again.stdout and not submitted_lines(again.stdout)


def ended_completed(job_ids: list[str]) -> None:
    """Each job, recorded ok, ends COMPLETED: it exits after its record is appended (submitit then
    writes its own result into the job's folder), so the submitter must not have removed that folder
    (before the fix, about half such jobs ended FAILED on this cluster)."""
    for job in job_ids:
        wait_until(
            lambda j=job: sacct_state(j) not in ("", "PENDING", "RUNNING", "COMPLETING"), f"{job} ended"
        )
    assert {job: sacct_state(job) for job in job_ids} == dict.fromkeys(job_ids, "COMPLETED")


def sacct_state(job_id: str) -> str:
    """sacct's state of the job ('' while sacct does not know it yet)."""
    done = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True
    )
    words = done.stdout.split()
    return words[0] if words else ""


@pytest.mark.timeout(420)
def test_a_time_limit_a_scancel_and_a_requeue_are_recorded_from_slurms_state(tmp_path):
    """bs=2 and bs=3 hang; SLURM ends bs=2 at its time limit and scancel ends bs=3; bs=4 is requeued
    while it runs and finishes on its second start. A rerun (no fault) runs the cancelled cell again."""
    suite, out = write_suite(tmp_path, "batch_size: [2, 3, 4]"), tmp_path / "o"
    submitter = start(suite, out, "--executor", "slurm", DITBENCH_INJECT_FAULT="bs=2=hang,bs=3=hang")
    ids: dict[str, str] = {}
    try:
        wait_until(lambda: len(job_ids(out)) == 3, "all three jobs were submitted", submitter)
        ids = {by: job_id for by, job_id in zip(("bs=2", "bs=3", "bs=4"), _ids_by_batch(out), strict=True)}
        # started: each task has set its signal handling (SLURM says RUNNING while python still starts)
        started = lambda: len(list(jobs_dir(out).glob("*.started.json"))) == 3  # noqa: E731
        wait_until(started, "all three started", submitter)
        # SLURM's time-limit warning (SIGUSR2, sent `signal_delay_s` ahead; submitit alone would turn
        # it into a FAILED job), then the limit itself brought forward to now: SLURM ends it TIMEOUT.
        # (TimeLimit=1, SLURM's shortest, sends both itself but takes a minute more.)
        subprocess.run(["scancel", "--signal=USR2", ids["bs=2"]], check=True)
        time.sleep(10)
        assert slurm_state(ids["bs=2"]) == "RUNNING"  # the warning alone ends nothing
        subprocess.run(["scontrol", "update", f"JobId={ids['bs=2']}", "EndTime=now"], check=True)
        subprocess.run(["scancel", ids["bs=3"]], check=True)
        subprocess.run(["scontrol", "requeue", ids["bs=4"]], check=True)
        stdout, _ = submitter.communicate(timeout=360)
    finally:
        if submitter.poll() is None:
            submitter.kill()
        subprocess.run(["scancel", *ids.values()])  # none left hanging when the test fails
    assert submitter.returncode == 0, stdout
    got = by_name(out)
    timed_out, cancelled, requeued = (_one(got, b) for b in ("bs=2", "bs=3", "bs=4"))
    assert timed_out["status"] == "timeout", timed_out
    assert f"SLURM stopped job {ids['bs=2']} at its time limit" in timed_out["reason"]
    assert cancelled["status"] == "error", cancelled
    assert f"SLURM job {ids['bs=3']} ended (CANCELLED)" in cancelled["reason"]
    assert requeued["status"] == "ok", requeued
    assert len(records(out)) == 3  # the requeued cell recorded once
    again = run(suite, out, "--executor", "slurm")
    assert "2 to submit" in again.stdout, again.stdout  # the timed-out and the cancelled cell
    assert _one(by_name(out), "bs=3")["status"] == "ok"
    assert len(records(out)) == 5


def _ids_by_batch(out: Path) -> list[str]:
    ids = []
    for batch in (2, 3, 4):
        for path in jobs_dir(out).glob("*.ticket.json"):
            if json.loads(path.read_text())["config"]["batch_size"] == batch:
                ids.append(
                    json.loads(path.with_name(path.name.replace(".ticket.", ".job.")).read_text())["job_id"]
                )
    return ids


def _one(records_by_name: dict[str, dict], part: str) -> dict:
    (record,) = [r for name, r in records_by_name.items() if f"{part} " in f"{name} "]
    return record


@pytest.mark.timeout(360)
def test_a_killed_submitter_is_rerun_waits_adopts_and_submits_nothing_twice(tmp_path):
    # two CPUs per job: the cluster runs two of the three cells at a time, the third queues
    suite, out = write_suite(tmp_path, "batch_size: [2, 3, 4]"), tmp_path / "o"
    slurm = ("--executor", "slurm", "--cluster", "sbatch.cpus-per-task=2")
    submitter = start(suite, out, *slurm)
    wait_until(lambda: len(job_ids(out)) == 3, "the jobs were submitted", submitter)
    ids = sorted(job_ids(out).values())
    wait_until(lambda: "PENDING" in {slurm_state(i) for i in ids}, "a job queued", submitter)
    submitter.send_signal(signal.SIGKILL)
    submitter.wait()
    # let one finish meanwhile: the rerun adopts it
    wait_until(lambda: any(jobs_dir(out).glob("*.result.json")), "a job wrote its result")
    again = run(suite, out, *slurm, timeout=300)
    assert not submitted_lines(again.stdout), again.stdout
    assert "waiting for job" in again.stdout
    got = records(out)
    assert sorted(r["status"] for r in got) == ["ok", "ok", "ok"], [r.get("reason") for r in got]
    assert all(r.get("adopted_by") for r in got)  # measured under the killed run's id
    assert sorted(r["slurm_job"]["id"] for r in got) == ids


@pytest.mark.timeout(300)
def test_an_oom_cancels_the_queued_larger_batches_of_its_series_and_records_them_skipped(tmp_path):
    """Under `plan:`, bs=2 runs out of memory while bs=3 and bs=4 queue (submitted held, so that the
    cluster cannot start them first): the submitter cancels both; each is `skipped`, naming bs=2."""
    suite = write_suite(tmp_path, "batch_size: [2, 3, 4]", extra="plan: {}\n")
    out = tmp_path / "o"
    slurm = ("--executor", "slurm", "--cluster", "sbatch.hold=true")
    submitter = start(suite, out, *slurm, DITBENCH_INJECT_FAULT="bs=2=oom")
    ids: dict[str, str] = {}
    try:
        wait_until(lambda: len(job_ids(out)) == 3, "all three jobs were submitted", submitter)
        ids = dict(zip(("bs=2", "bs=3", "bs=4"), _ids_by_batch(out), strict=True))
        assert {slurm_state(i) for i in ids.values()} == {"PENDING"}
        subprocess.run(["scontrol", "release", ids["bs=2"]], check=True)
        stdout, _ = submitter.communicate(timeout=240)
    finally:
        if submitter.poll() is None:
            submitter.kill()
        subprocess.run(["scancel", *ids.values()])
    assert submitter.returncode == 0, stdout
    got = by_name(out)
    assert {name.split()[-1]: r["status"] for name, r in got.items()} == {
        "bs=2": "oom",
        "bs=3": "skipped",
        "bs=4": "skipped",
    }, stdout
    for batch in ("bs=3", "bs=4"):
        skipped = _one(got, batch)
        assert skipped["reason"] == (
            "DiT-T/4 fp32 ckpt=none bs=2 ran out of memory at batch 2; this larger batch of the same "
            f"series would too; ditbench cancelled its queued SLURM job {ids[batch]}"
        )
        assert skipped["slurm_job"] == {"id": ids[batch], "nodes": None}  # it never ran on a node
        assert skipped["metrics"]["prediction"]["status"] == "predicted"  # the planner's word is kept
        assert f"cancelled queued job {ids[batch]} " in stdout
    # sacct folds an array's tasks that never started into one row (e.g. 137_[0-1%3]): never started.
    # A task cancelled while pending has no start, or (seen under load, Slurm 22.05) its start set to
    # the moment it was cancelled, its end: either way it ran for no time.
    array = ids["bs=2"].split("_")[0]
    rows = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", array, "-o", "JobID,State,Start,End"],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    others = [row.split("|") for row in rows if row.split("|")[0] != ids["bs=2"]]
    assert others and all(
        s.startswith("CANCELLED") and start in ("None", end) for _, s, start, end in others
    ), rows


KILL_AFTER_SBATCH = """
import os, signal, sys
from ditbench.bench.launch import executors
def die(self, path):  # sbatch has answered; the job id is about to be written down
    os.kill(os.getpid(), signal.SIGKILL)
executors.JobRef.save = die
from ditbench.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(300)
def test_a_submitter_killed_between_sbatchs_answer_and_the_job_file_submits_nothing_twice(tmp_path):
    suite, out = write_suite(tmp_path, "batch_size: [2, 3]"), tmp_path / "o"
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_SBATCH, "run", suite, "--out", str(out), "--no-progress"]
        + ["--executor", "slurm"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert not job_ids(out) and len(list(jobs_dir(out).glob("*.sbatch.json"))) == 2
    again = run(suite, out, "--executor", "slurm")
    assert not submitted_lines(again.stdout), again.stdout
    found = [line for line in again.stdout.splitlines() if line.startswith("found job ")]
    assert len(found) == 2, again.stdout
    array = {line.split()[2].split("_")[0] for line in found}
    assert len(array) == 1  # the one array the killed run submitted
    got = records(out)
    assert sorted(r["status"] for r in got) == ["ok", "ok"], [r.get("reason") for r in got]
    assert sorted(r["slurm_job"]["id"] for r in got) == sorted(line.split()[2] for line in found)
    # SLURM has exactly one job array under the submission's name (sacct lists its two tasks)
    names = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-S", "now-1hours", "-o", "JobID,JobName"], capture_output=True, text=True
    ).stdout.split()
    ours = [line for line in names if line.split("|")[0].split("_")[0] in array]
    assert len(ours) == 2 and len({line.split("|")[1] for line in ours}) == 1, ours


@pytest.mark.timeout(120)
def test_sacct_lag_right_after_submission_never_becomes_an_ended_state(tmp_path):
    """sacct does not know a job for a few seconds after sbatch; squeue does. A job that runs is
    never taken for ended, and a job that ends quickly is COMPLETED, nothing else, once it ends."""
    folder = str(tmp_path)

    def submit(command: str) -> str:
        done = subprocess.run(
            ["sbatch", "--parsable", "-o", os.devnull, "--wrap", command], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    executors._squeued.clear()
    sleeper, quick = submit("sleep 60"), submit("true")
    try:
        seen = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            seen.append(executors.state(executors.JobRef("slurm", sleeper, folder)))
            time.sleep(0.5)
        assert set(seen) <= executors.ACTIVE_STATES, seen
        ended = []
        while True:
            found = executors.state(executors.JobRef("slurm", quick, folder))
            if found not in executors.ACTIVE_STATES:
                ended.append(found)
                break
            time.sleep(1)
        assert ended == ["COMPLETED"]
    finally:
        subprocess.run(["scancel", sleeper])


GPU_VIEW = """
import json, os, types
import submitit
from ditbench.bench.launch.srun import _rank_env
spec = types.SimpleNamespace(device="cuda", knobs=types.SimpleNamespace(threads=None))
env = _rank_env(spec, submitit.JobEnvironment())
print(json.dumps({"rank": env["RANK"], "local_rank": env["LOCAL_RANK"],
                  "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                  "job_gpus": os.environ.get("SLURM_JOB_GPUS")}))
"""


@pytest.mark.timeout(180)
def test_each_rank_of_a_two_gpu_cell_gets_the_jobs_gpus_and_its_own_local_rank(tmp_path):
    """The cluster's stand-in GPUs (tests/cluster/slurm.sh: two per node) through the batch script
    ditbench writes for a 2-GPU cell: each task sees the job's two GPUs and takes cuda:LOCAL_RANK."""
    import submitit

    from ditbench.bench.jobs import ClusterOptions, job_parameters

    gres = subprocess.run(["sinfo", "-h", "-N", "-o", "%G"], capture_output=True, text=True).stdout.split()
    if not gres or any(g != "gpu:2" for g in gres):
        pytest.skip(
            f"the cluster has no stand-in GPUs (sinfo gres: {gres}); tests/cluster/slurm.sh makes them"
        )
    config = {"gpus": 2, "nodes": 1, "device": "cuda"}
    params = job_parameters(config, 60, ClusterOptions(), "slurm")
    executor = executors.make_executor("slurm", tmp_path / "submitit")
    executors.configure(executor, "slurm", params)
    job = executor.submit(submitit.helpers.CommandFunction([sys.executable, "-c", GPU_VIEW]))
    script = Path(job.paths.submission_file).read_text()
    assert "#SBATCH --gpus-per-node=2" in script and "#SBATCH --ntasks-per-node=2" in script
    views = sorted((json.loads(out) for out in job.results()), key=lambda v: v["rank"])
    assert [v["local_rank"] for v in views] == ["0", "1"], views
    job_gpus = views[0]["job_gpus"].split(",")
    assert len(job_gpus) == 2
    # cuda:LOCAL_RANK is a different one of the job's own GPUs in each rank
    assert all(v["cuda_visible_devices"] == ",".join(job_gpus) for v in views), views
