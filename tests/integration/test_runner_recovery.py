"""The runner never loses or duplicates a result: one run per output folder, results adopted after a
SIGKILL at any moment (between a cell's end and its append included), nothing left in the temp folder."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ditbench.cli import main
from ditbench.files.outlock import LOCK_NAME
from ditbench.records.jsonl import read_records

REPO = Path(__file__).resolve().parents[2]


def write_suite(tmp_path, batches=(1,), name="t", image_size=64):
    text = f"""
    name: {name}
    device: cpu
    defaults:
      model: DiT-T/8
      image_size: {image_size}
      steps: {{warmup: 1, measure: 2, min_seconds: 0}}
      timeout_s: 3600
    matrix: {{batch_size: {list(batches)}}}
    """
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def env(**extra):
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), out.get("PYTHONPATH")) if p)
    out["OMP_NUM_THREADS"] = "1"
    out.pop("DITBENCH_INJECT_FAULT", None)
    out.update(extra)
    return out


def run_command(suite, out):
    return [sys.executable, "-m", "ditbench", "run", str(suite), "--out", str(out), "--no-progress"]


def lock_holder(out: Path) -> int | None:
    try:
        return json.loads((out / LOCK_NAME).read_text()).get("pid")
    except (OSError, ValueError):
        return None


def wait_for(predicate, proc, what):
    """Poll until predicate() holds; no wall-clock bound (pytest-timeout stops a hung test)."""
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_second_run_on_the_same_out_exits_2_naming_the_first(tmp_path, capsys):
    suite, out = write_suite(tmp_path), tmp_path / "out"
    first = subprocess.Popen(
        run_command(suite, out),
        env=env(DITBENCH_INJECT_FAULT="bs=1=hang"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: lock_holder(out) == first.pid, first, "it took the lock")
        assert main(["run", str(suite), "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"PID {first.pid}" in err and "in use" in err and "Traceback" not in err
        assert not (out / "results.jsonl").exists()  # the second run started nothing
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    # The killed run's lock died with it, its cut-off cell left nothing to adopt: the rerun runs it.
    assert main(["run", str(suite), "--out", str(out), "--no-progress"]) == 0
    (record,) = read_records(out / "results.jsonl")
    assert record["status"] == "ok" and "adopted_by" not in record
    assert list((out / ".inflight").iterdir()) == []


KILL_AT = textwrap.dedent(
    """
    import os, signal, sys
    from ditbench.bench import inflight
    from ditbench.cli import main
    append = inflight.append_record

    def killed_before(path, record):
        os.kill(os.getpid(), signal.SIGKILL)

    def killed_after(path, record):
        append(path, record)
        os.kill(os.getpid(), signal.SIGKILL)

    inflight.append_record = {"before": killed_before, "after": killed_after}[sys.argv[1]]
    main(sys.argv[2:])
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["before", "after"])
def test_a_kill_next_to_the_append_loses_and_duplicates_nothing(tmp_path, moment):
    """Killed after the cell wrote its result, just before (or just after) the runner appended it."""
    suite, out = write_suite(tmp_path), tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT, moment, *run_command(suite, out)[3:]], env=env(), capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    results = out / "results.jsonl"
    (ticket,) = (out / ".inflight").glob("*.ticket.json")
    measured = json.loads(ticket.with_name(ticket.name.replace("ticket", "result")).read_text())
    assert measured["status"] == "ok"
    assert len(read_records(results)) == (1 if moment == "after" else 0)

    rerun = subprocess.run(run_command(suite, out), env=env(), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    (record,) = read_records(results)  # one record: the measurement, never rerun, never appended twice
    assert record["metrics"]["step_ms"] == measured["metrics"]["step_ms"]
    assert ("adopted_by" in record) == (moment == "before")
    assert ("adopted the finished result" in rerun.stderr) == (moment == "before")  # progress: stderr
    assert "1 of 1 cells already ok" in rerun.stderr
    assert list((out / ".inflight").iterdir()) == []


@pytest.mark.slow
def test_repeated_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path):
    """Kill the runner at random moments, half of them the instant a cell's result file appears (the
    window between the cell's end and its append); rerun to completion after each kill."""
    cells = 4
    suite, out = write_suite(tmp_path, batches=range(1, cells + 1)), tmp_path / "out"
    results, folder = out / "results.jsonl", out / ".inflight"
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    left_behind = set()  # (run_id, cell_id) of results a killed run left unappended
    kills = 0
    for attempt in range(6):
        before = results.read_bytes() if results.exists() else b""
        proc = subprocess.Popen(
            run_command(suite, out), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if attempt % 2 == 0:  # the instant a result file appears
            ended_or_result = lambda p=proc: p.poll() is not None or any(folder.glob("*.result.json"))  # noqa: E731
            wait_for(ended_or_result, proc, "a result")
        else:
            deadline = time.monotonic() + rng.uniform(0.5, 12.0)
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        after = results.read_bytes() if results.exists() else b""
        kept = before[: before.rfind(b"\n") + 1]  # complete lines (a torn tail is not a record)
        assert after.startswith(kept), f"seed {seed}: a record was lost or rewritten"
        for ticket in folder.glob("*.ticket.json") if folder.is_dir() else ():
            if ticket.with_name(ticket.name.replace("ticket", "result")).exists():
                context = json.loads(ticket.read_text())
                left_behind.add((context["run_id"], context["cell_id"]))
    final = subprocess.run(run_command(suite, out), env=env(), capture_output=True, text=True)
    assert final.returncode == 0, final.stderr
    records = read_records(results)
    ok = [r["cell_id"] for r in records if r["status"] == "ok"]
    assert len(ok) == len(set(ok)) == cells, f"seed {seed}: {ok}"
    assert all(r["status"] == "ok" for r in records), f"seed {seed}"
    keys = [(r["run_id"], r["cell_id"]) for r in records]
    assert len(keys) == len(set(keys)), f"seed {seed}: a result appended twice"
    assert left_behind <= set(keys), f"seed {seed}: a finished result was never appended"
    assert kills >= 3, f"seed {seed}: the runs finished before they could be killed"
    assert list(folder.iterdir()) == []


@pytest.mark.slow
def test_a_cpu_batch_too_large_for_memory_is_oom_and_skips_its_series(tmp_path):
    """Under an address-space limit the CPU allocator refuses the batch: `oom`, so the larger batch is
    skipped. (RLIMIT_AS on the runner, inherited by the cell: nothing really allocates gigabytes.)"""
    path = write_suite(tmp_path, batches=(1 << 19, 1 << 20), name="oom", image_size=128)
    out = tmp_path / "out"
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (5 << 30, 5 << 30)); "
        "from ditbench.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *run_command(path, out)[3:]], env=env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    by_batch = {r["config"]["batch_size"]: r for r in read_records(out / "results.jsonl")}
    small, big = by_batch[1 << 19], by_batch[1 << 20]
    assert small["status"] == "oom", small["reason"]
    assert "can't allocate memory" in small["reason"] and "traceback" not in small
    assert big["status"] == "skipped" and "ran out of memory at batch 524288" in big["reason"]


@pytest.mark.slow
def test_a_multi_process_cell_leaves_nothing_in_the_temp_folder(tmp_path):
    suite = write_suite(tmp_path)
    suite.write_text(suite.read_text().replace("batch_size: [1]", "batch_size: [1], gpus: [2]"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    proc = subprocess.run(run_command(suite, out), env=env(TMPDIR=str(tmp)), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (record,) = read_records(out / "results.jsonl")
    assert record["status"] == "ok" and record["metrics"]["world_size"] == 2, record["reason"]
    leftovers = [p.name for p in tmp.iterdir()]
    assert not [n for n in leftovers if n.startswith(("torchelastic_", "ditbench-"))], leftovers
    assert list((out / ".inflight").iterdir()) == []
