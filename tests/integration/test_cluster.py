"""`--executor slurm` without a cluster: the `cluster:` options, the batch scripts sbatch gets, the
torch.distributed environment a task takes from SLURM, and the submitter's pick-up of jobs an earlier
(killed) submitter left. sbatch, sacct, scancel and srun are fake commands on PATH; nothing runs a cell."""

from __future__ import annotations

import json
import os
import random
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("submitit")

from ditbench.bench import inflight  # noqa: E402
from ditbench.bench.jobs import JOBS_DIR, job_parameters, job_path, job_timeout_min, submit_suite  # noqa: E402
from ditbench.bench.launch.executors import JobRef  # noqa: E402
from ditbench.bench.runner import RunOptions  # noqa: E402
from ditbench.cli import main  # noqa: E402
from ditbench.core.errors import UserError  # noqa: E402
from ditbench.records.jsonl import read_records  # noqa: E402
from ditbench.spec.cluster import ClusterOptions, parse_cluster_flags  # noqa: E402
from ditbench.spec.suite import load_suite, parse_suite  # noqa: E402

SUITE = """
name: c
device: {device}
defaults:
  model: DiT-T/4
  image_size: 32
  num_classes: 10
  steps: {{warmup: 1, measure: 2, min_seconds: 0}}
  timeout_s: 600
matrix:
  batch_size: [2, 4]
  gpus: [1, 2]
include:
  - {{gpus: 2, nodes: 2, batch_size: 2}}
{cluster}
"""
CLUSTER = """
cluster:
  partition: gpu
  account: dit_team
  qos: high
  constraint: h100
  sbatch: {mem: 0, cpus-per-task: 8, exclusive: true}
  setup: ["module load cuda/12.4"]
"""


def write_suite(tmp_path, device="cuda", cluster=CLUSTER) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(SUITE.format(device=device, cluster=cluster)))
    return path


def base_suite(**cluster):
    raw = {"name": "x", "device": "cpu", "matrix": {"batch_size": [1]}}
    if cluster:
        raw["cluster"] = cluster
    return raw


# -- the cluster: section and --cluster ------------------------------------------------------------


@pytest.mark.parametrize(
    "cluster, needle",
    [
        ({"partiton": "gpu"}, "at `cluster.partiton`: unknown key `partiton`. Did you mean `partition`?"),
        ({"partition": "gpu\n#SBATCH --uid=0"}, "at `cluster.partition`: expected non-empty text"),
        ({"partition": ""}, "at `cluster.partition`"),
        ({"account": ["a"]}, "at `cluster.account`: expected text"),
        ({"time_limit_min": 0}, "at `cluster.time_limit_min`: expected whole minutes"),
        ({"time_limit_min": 1.5}, "at `cluster.time_limit_min`"),
        ({"sbatch": {"time": 10}}, "--time is set by ditbench from the cell"),
        ({"sbatch": {"partition": "x"}}, "--partition is set by `cluster.partition`"),
        ({"sbatch": {"bad key!": 1}}, "expected an sbatch option name"),
        ({"sbatch": {"mem": float("nan")}}, "not a finite number"),
        ({"sbatch": ["mem=0"]}, "at `cluster.sbatch`: expected a mapping"),
        ({"setup": "module load cuda"}, "at `cluster.setup`: expected a list"),
        ({"setup": ["ok", "two\nlines"]}, "at `cluster.setup[1]`"),
    ],
)
def test_a_bad_cluster_section_is_refused_naming_the_key(cluster, needle):
    with pytest.raises(UserError) as err:
        parse_suite(base_suite(**cluster), "s.yaml")
    assert "suite s.yaml" in str(err.value) and needle in str(err.value)


def test_the_cluster_section_is_read_and_never_enters_a_cell_id(tmp_path):
    with_cluster = load_suite(write_suite(tmp_path))
    without = load_suite(write_suite(tmp_path, cluster=""))
    assert with_cluster.cluster.partition == "gpu" and with_cluster.cluster.qos == "high"
    assert with_cluster.cluster.sbatch == {"mem": 0, "cpus-per-task": 8, "exclusive": True}
    assert [c.cell_id for c in with_cluster.cells] == [c.cell_id for c in without.cells]
    assert without.cluster == ClusterOptions()


def test_cluster_flags_override_the_suite_and_are_checked_like_it():
    flags = parse_cluster_flags(["partition=debug", "time_limit_min=90", "sbatch.mem=16G"])
    merged = ClusterOptions(partition="gpu", account="a", sbatch={"mem": 0, "gres": "x"}).merged(flags)
    assert (merged.partition, merged.account, merged.time_limit_min) == ("debug", "a", 90)
    assert merged.sbatch == {"mem": "16G", "gres": "x"}
    for bad, needle in [
        (["partition"], "expected KEY=VALUE"),
        (["nodes=2"], "--cluster nodes: unknown key"),
        (["sbatch.output=x"], "--output is set by ditbench"),
        (["time_limit_min=soon"], "--cluster time_limit_min: expected whole minutes"),
    ]:
        with pytest.raises(UserError, match=re.escape(needle)):
            parse_cluster_flags(bad)


def test_the_cli_refuses_cluster_flags_that_would_not_shape_the_run(tmp_path, capsys):
    suite = write_suite(tmp_path, device="cpu", cluster="")
    assert main(["run", str(suite), "--out", str(tmp_path / "o"), "--cluster", "partition=gpu"]) == 2
    assert "add --executor slurm" in capsys.readouterr().err
    args = ["run", str(suite), "--out", str(tmp_path / "o"), "--executor", "local", "--cluster", "qos=x"]
    assert main(args) == 2
    assert "--executor local does not use" in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_the_job_time_limit_is_the_cell_timeout_plus_a_margin():
    assert job_timeout_min(600) == 15  # 600 s + 300 s margin
    assert job_timeout_min(36000) == 660  # 10 h + 10 %
    config = {"gpus": 2, "nodes": 1, "device": "cuda"}
    assert job_parameters(config, 600, ClusterOptions(time_limit_min=60), "slurm")["time"] == 60
    with pytest.raises(UserError, match="time_limit_min 10 is shorter than a cell's timeout"):
        job_parameters(config, 600, ClusterOptions(time_limit_min=10), "slurm")
    local = job_parameters(config, 600, ClusterOptions(partition="gpu"), "local")
    assert local == {"timeout_min": 15, "nodes": 1, "tasks_per_node": 2, "gpus_per_node": 2}


# -- a fake SLURM on PATH ------------------------------------------------------------------------


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch keeps each script and answers a fresh job id; sacct says every job TIMEOUT; scancel logs."""
    bin_dir, seen = tmp_path / "bin", tmp_path / "sbatch_seen"
    bin_dir.mkdir()
    seen.mkdir()
    first = random.randint(10_000, 900_000) * 100  # the watcher caches finished ids across tests
    scripts = {
        "sbatch": f"""n=$(ls {seen} | wc -l); id=$(({first} + n)); cp "$1" {seen}/$id.sh
                     echo "Submitted batch job $id" """,
        "sacct": """echo 'JobID|State|NodeList'
                    while [ $# -gt 0 ]; do if [ "$1" = -j ]; then shift
                      echo "${1}_[0-9]|TIMEOUT|node1"; echo "$1|TIMEOUT|node1"; fi; shift; done""",
        "scancel": f'echo "$@" >> {tmp_path}/scancelled',
        "srun": "exit 0",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + textwrap.dedent(body) + "\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return seen


def sbatch_flags(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(.*))?$", text, re.M))


def test_slurm_submission_writes_one_array_per_job_shape_with_the_cells_resources(tmp_path, fake_slurm):
    suite = load_suite(write_suite(tmp_path))
    out = tmp_path / "out"
    options = RunOptions(out=out, progress=False)
    lines = []
    records = submit_suite(suite, options, "slurm", suite.cluster, echo=lines.append, poll_s=0.01)
    scripts = [p.read_text() for p in sorted(fake_slurm.glob("*.sh"))]
    assert len(scripts) == 3  # gpus=1 (2 cells), gpus=2 (2 cells), the 2-node cell
    flags = {(f["gpus-per-node"], f["nodes"]): f for f in map(sbatch_flags, scripts)}
    assert set(flags) == {("1", "1"), ("2", "1"), ("2", "2")}
    for f in flags.values():
        assert (f["partition"], f["account"], f["qos"], f["constraint"]) == (
            "gpu",
            "dit_team",
            "high",
            "h100",
        )
        assert f["mem"] == "0" and f["cpus-per-task"] == "8" and "exclusive" in f
        assert f["time"] == "15"  # the suite's 600 s + the 300 s margin
    assert flags["1", "1"]["array"] == "0-1%2" and flags["1", "1"]["ntasks-per-node"] == "1"
    assert flags["2", "1"]["array"] == "0-1%2" and flags["2", "1"]["ntasks-per-node"] == "2"
    assert "array" not in flags["2", "2"] and flags["2", "2"]["ntasks-per-node"] == "2"  # 4 ranks on 2 nodes
    for text in scripts:
        srun = next(line for line in text.splitlines() if line.startswith("srun "))
        assert "--gpu-bind" not in srun  # SLURM's default: each task sees the job's GPUs (cuda:LOCAL_RANK)
        assert "module load cuda/12.4" in text and "export PYTHONPATH=" in text
        assert re.search(r"^srun --unbuffered .* -u -m submitit.core._submit ", text, re.M)
        assert "torchrun" not in text and "torch.distributed.run" not in text
    # sacct says TIMEOUT and no job wrote a result: each cell is recorded `timeout`, once
    assert [r["status"] for r in records] == ["timeout"] * 5
    assert all("SLURM stopped job" in r["reason"] for r in records)
    assert len(read_records(out / "results.jsonl")) == 5
    assert not list((out / JOBS_DIR).glob("*.json"))  # every ticket and job file cleaned up


def test_an_sbatch_refusal_is_one_clear_error_and_leaves_no_ticket(tmp_path, fake_slurm, capsys):
    (fake_slurm.parent / "bin" / "sbatch").write_text(
        "#!/bin/bash\necho 'sbatch: error: invalid partition specified: gpux' >&2\nexit 1\n"
    )
    suite = write_suite(tmp_path)
    out = tmp_path / "out"
    assert main(["run", str(suite), "--out", str(out), "--executor", "slurm", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "invalid partition specified: gpux" in err and "Traceback" not in err
    assert not list((out / JOBS_DIR).glob("*.ticket.json"))
    assert not (out / "results.jsonl").exists() or not read_records(out / "results.jsonl")


def test_without_srun_the_slurm_executor_says_where_to_run_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun, no sbatch
    suite = write_suite(tmp_path)
    args = ["run", str(suite), "--out", str(tmp_path / "o"), "--executor", "slurm", "--no-progress"]
    assert main(args) == 2
    assert "run it on a SLURM login node" in " ".join(capsys.readouterr().err.split())
    assert not list((tmp_path / "o" / JOBS_DIR).glob("*.ticket.json"))


# -- inside the job ------------------------------------------------------------------------------


def test_a_task_takes_its_rank_and_rendezvous_from_slurm(monkeypatch):
    import submitit

    from ditbench.bench.launch.srun import _rank_env

    slurm = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "777",
        "SLURM_NTASKS": "8",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)

    class Spec:
        device = "cuda"
        knobs = SimpleNamespace(threads=None)  # the threads knob unset: torch's default on CUDA

    env = _rank_env(Spec(), submitit.JobEnvironment())
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "5",
        "8",
        "1",
        "4",
    )
    assert env["MASTER_ADDR"] == "gpu07" and env["GROUP_RANK"] == "1"
    assert 20000 <= int(env["MASTER_PORT"]) <= 60000


# -- picking up what a killed submitter left -------------------------------------------------------


def leave_ticket(out: Path, suite, cell, result: dict | None, job_id: str = "999999999"):
    """A ticket as a killed submitter leaves it: submitted to a local job that is gone by now."""
    folder = out / JOBS_DIR
    context = {
        "suite": suite.name,
        "run_id": "20260101T000000Z-dead00",
        "cell_id": cell.cell_id,
        "cell_name": cell.cell_name,
        "suite_baseline": suite.baseline,
        "suite_overrides": {},
        "config": cell.config,
        "env": {},
        "started_at": "2026-01-01T00:00:00Z",
    }
    ticket = inflight.open_ticket(folder, context)
    JobRef("local", job_id, str(folder / "submitit"), None).save(job_path(ticket))
    if result is not None:
        inflight.write_result_file(ticket, result)
    return ticket


def test_a_rerun_appends_the_result_of_a_job_that_finished_while_no_submitter_ran(tmp_path):
    suite = load_suite(write_suite(tmp_path, device="cpu", cluster=""))
    cell = suite.cells[0]
    out = tmp_path / "out"
    metrics = {
        "images_per_s": 12.5,
        "steps_per_s": 6.25,
        "step_ms": {"median": 160.0, "p10": 150.0, "p90": 170.0},
    }
    leave_ticket(out, suite, cell, {"status": "ok", "metrics": metrics, "env": {"host": "n1"}})
    options = RunOptions(out=out, progress=False, cell_filters=[cell.cell_id])
    records = submit_suite(suite, options, "local", echo=lambda line: None, poll_s=0.01)
    assert len(records) == 1 and records[0]["status"] == "ok" and records[0]["metrics"] == metrics
    assert records[0]["run_id"] == "20260101T000000Z-dead00" and records[0]["adopted_by"]
    assert len(read_records(out / "results.jsonl")) == 1
    assert not list((out / JOBS_DIR).glob("*.json"))
    # and a second rerun neither appends it again nor runs the cell
    again = submit_suite(suite, options, "local", echo=lambda line: None, poll_s=0.01)
    assert again == records and len(read_records(out / "results.jsonl")) == 1


def test_a_job_that_ended_without_a_result_is_recorded_as_an_error(tmp_path, monkeypatch):
    suite = load_suite(write_suite(tmp_path, device="cpu", cluster=""))
    cell = suite.cells[0]
    out = tmp_path / "out"
    leave_ticket(out, suite, cell, None)
    lines: list[str] = []
    options = RunOptions(out=out, progress=False, cell_filters=[cell.cell_id])
    # the cell would be submitted again after its error record: stop right there
    import ditbench.bench.jobs as jobs

    class Stop(Exception):
        pass

    def no_submit(self, pending):
        assert [job.cell.cell_id for job in pending] == [cell.cell_id]
        raise Stop

    monkeypatch.setattr(jobs.Submitit, "submit", no_submit)
    with pytest.raises(Stop):
        submit_suite(suite, options, "local", echo=lines.append, poll_s=0.01)
    (record,) = read_records(out / "results.jsonl")
    assert record["status"] == "error" and "local job 999999999 ended" in record["reason"]
    assert "without writing a result" in record["reason"]
    assert json.dumps(record.dump())  # a plain JSON record


@pytest.mark.parametrize(
    "ref",
    [
        {"executor": "slurm", "job_id": "12; scancel -u me", "folder": "x"},
        {"executor": "local", "job_id": "0", "folder": "x"},
        {"executor": "pbs", "job_id": "12", "folder": "x"},
        {"executor": "slurm", "job_id": 12, "folder": "x"},
        {"executor": "slurm"},
    ],
)
def test_a_tampered_job_file_is_ignored_and_never_cancelled(tmp_path, ref):
    path = tmp_path / "x.job.json"
    path.write_text(json.dumps(ref))
    assert JobRef.load(path) is None


def test_a_live_process_that_is_not_our_job_is_not_waited_for():
    from ditbench.bench.launch.executors import is_active

    me = JobRef("local", str(os.getpid()), "x", None)  # a live pid, but no controller of ours
    assert not is_active(me)


def test_a_second_submitter_on_the_same_out_exits_2_and_a_jobs_file_is_refused(tmp_path, capsys):
    from ditbench.files.outlock import OutputLock

    suite, out = write_suite(tmp_path, device="cpu", cluster=""), tmp_path / "out"
    args = ["run", str(suite), "--out", str(out), "--executor", "local", "--no-progress"]
    out.mkdir()
    with OutputLock(out):
        assert main(args) == 2
    err = capsys.readouterr().err
    assert "in use" in err and "Traceback" not in err
    (out / JOBS_DIR).write_text("not a folder")
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert ".jobs" in err and "is a file" in err and "Traceback" not in err


@pytest.mark.slow
def test_the_default_path_never_imports_submitit_and_without_it_executor_says_how_to_install(
    tmp_path, monkeypatch, capsys
):
    import subprocess
    import sys

    suite = write_suite(tmp_path, device="cpu", cluster=CLUSTER)
    code = (
        "import sys; from ditbench.cli import main; "
        f"rc = main(['run', {str(suite)!r}, '--dry-run', '--out', {str(tmp_path / 'o')!r}]); "
        "assert rc == 0 and 'submitit' not in sys.modules, sorted(m for m in sys.modules if 'submitit' in m)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if not installed
    args = ["run", str(suite), "--out", str(tmp_path / "o"), "--executor", "local", "--no-progress"]
    assert main(args) == 2
    assert 'pip install "ditbench[slurm]"' in " ".join(capsys.readouterr().err.split())


def test_without_accounting_a_job_squeue_no_longer_lists_has_ended(tmp_path, fake_slurm):
    bin_dir = fake_slurm.parent / "bin"
    (bin_dir / "sacct").write_text(
        "#!/bin/bash\necho 'sacct: error: accounting storage is disabled' >&2\nexit 1\n"
    )
    (bin_dir / "squeue").write_text("#!/bin/bash\nexit 0\n")  # lists nothing: the job is gone
    (bin_dir / "squeue").chmod(0o755)
    suite = load_suite(write_suite(tmp_path, device="cpu", cluster=""))
    options = RunOptions(out=tmp_path / "out", progress=False, cell_filters=[suite.cells[0].cell_id])
    (record,) = submit_suite(suite, options, "slurm", echo=lambda line: None, poll_s=0.01)
    assert record["status"] == "error" and "ended (NOT_IN_QUEUE) without writing a result" in record["reason"]
    assert record["env"] is None  # never the login node's environment


@pytest.mark.parametrize("end", ["COMPLETED", "FAILED"])
def test_a_job_that_wrote_its_result_keeps_its_submitit_folder_until_slurm_says_it_ended(
    tmp_path, fake_slurm, end
):
    """The record is appended as the result file appears, while the job still runs (submitit writes
    its own result into the job's folder as it exits): the folder goes only once sacct says COMPLETED;
    a job that ended another way keeps its logs there, and the run says where."""
    from submitit.slurm.slurm import SlurmJob

    state = tmp_path / "state"
    state.write_text("RUNNING")
    sacct = fake_slurm.parent / "bin" / "sacct"
    sacct.write_text(
        "#!/bin/bash\necho 'JobID|State|NodeList'\n"
        'while [ $# -gt 0 ]; do if [ "$1" = -j ]; then shift\n'
        f'echo "$1|$(cat {state})|node1"; fi; shift; done\n'
    )
    suite = load_suite(write_suite(tmp_path, device="cpu", cluster=""))
    cell, out = suite.cells[0], tmp_path / "out"
    job_id = str(random.randint(10_000, 900_000) * 100 + 99)  # the watcher caches finished ids across tests
    metrics = {
        "images_per_s": 12.5,
        "steps_per_s": 6.25,
        "step_ms": {"median": 160.0, "p10": 150.0, "p90": 170.0},
    }
    ticket = leave_ticket(out, suite, cell, {"status": "ok", "metrics": metrics, "env": {"host": "node1"}})
    submitit_dir = out / JOBS_DIR / "submitit"
    JobRef("slurm", job_id, str(submitit_dir)).save(job_path(ticket))
    (submitit_dir / job_id).mkdir(parents=True)
    (submitit_dir / job_id / f"{job_id}_0_log.out").write_text("the job's own log\n")
    options = RunOptions(out=out, progress=False, cell_filters=[cell.cell_id])
    lines: list[str] = []
    (record,) = submit_suite(suite, options, "slurm", echo=lines.append, poll_s=0.01)
    assert record["status"] == "ok" and record["slurm_job"]["id"] == job_id
    assert (submitit_dir / job_id / f"{job_id}_0_log.out").exists()  # the job still runs: left alone
    assert "1 job(s) still ending after their records" in lines[-1]

    state.write_text(end)
    SlurmJob.watcher.clear()  # sacct is asked again at once, not after submitit's back-off
    lines.clear()
    assert submit_suite(suite, options, "slurm", echo=lines.append, poll_s=0.01) == [record]
    assert len(read_records(out / "results.jsonl")) == 1
    assert not list(submitit_dir.glob("*.ending.json"))
    if end == "COMPLETED":
        assert not (submitit_dir / job_id).exists()
        assert not [line for line in lines if line.startswith("job ")]
    else:
        assert (submitit_dir / job_id / f"{job_id}_0_log.out").exists()
        assert [line for line in lines if line.startswith("job ")] == [
            f"job {job_id} ended FAILED after writing its cell's result (the record stands); "
            f"its logs stay in {submitit_dir / job_id}"
        ]
