"""Finding a SLURM job whose id the submitter never wrote down: by the submission's job name, through
squeue and then sacct (fake commands on PATH here; tests/integration/test_cluster_live.py does it live)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ditbench.bench.launch import executors
from ditbench.bench.launch.executors import JobRef

NAME = executors.job_name(["aaaaaaaaaaaa.run1", "bbbbbbbbbbbb.run1"])


@pytest.fixture
def slurm_says(tmp_path, monkeypatch):
    """slurm_says(squeue=TEXT, sacct=TEXT, squeue_rc=0, sacct_rc=0): fake commands that print TEXT."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def write(squeue="", sacct="", squeue_rc=0, sacct_rc=0):
        for command, text, rc in (("squeue", squeue, squeue_rc), ("sacct", sacct, sacct_rc)):
            path = bin_dir / command
            path.write_text(
                f"#!/bin/sh\necho \"$@\" >> {bin_dir}/{command}.args\nprintf '{text}'\nexit {rc}\n"
            )
            path.chmod(path.stat().st_mode | stat.S_IEXEC)
        return bin_dir

    return write


def submission(tmp_path, name=NAME, index=1):
    path = tmp_path / "k.sbatch.json"
    executors.write_submission(path, name, index)
    return path


def test_the_job_name_is_a_hash_of_the_tickets_and_differs_per_submission():
    assert NAME.startswith("ditbench-") and len(NAME) == len("ditbench-") + 16
    assert executors.job_name(["aaaaaaaaaaaa.run1"]) != NAME
    assert executors.job_name(["aaaaaaaaaaaa.run1", "bbbbbbbbbbbb.run1"]) == NAME


def test_squeue_names_the_array_and_the_cell_takes_its_index(tmp_path, slurm_says):
    bin_dir = slurm_says(squeue="4711\\n4711\\n")
    assert executors.find_submitted(submission(tmp_path), "F") == JobRef("slurm", "4711_1", "F")
    assert f"--name={NAME}" in (bin_dir / "squeue.args").read_text()
    assert not (bin_dir / "sacct.args").exists()  # squeue answered


def test_a_job_of_its_own_has_no_index(tmp_path, slurm_says):
    slurm_says(squeue="52\\n")
    assert executors.find_submitted(submission(tmp_path, index=None), "F") == JobRef("slurm", "52", "F")


def test_a_job_squeue_forgot_is_found_in_sacct(tmp_path, slurm_says):
    bin_dir = slurm_says(squeue="", sacct="4711_[0-1]\\n4711_0\\n")
    assert executors.find_submitted(submission(tmp_path), "F") == JobRef("slurm", "4711_1", "F")
    assert f"--name={NAME}" in (bin_dir / "sacct.args").read_text()


def test_no_job_under_the_name_or_no_answer_means_never_submitted(tmp_path, slurm_says):
    slurm_says(squeue="", sacct="")
    assert executors.find_submitted(submission(tmp_path), "F") is None
    slurm_says(squeue="", squeue_rc=1, sacct="", sacct_rc=1)
    assert executors.find_submitted(submission(tmp_path), "F") is None


def test_two_jobs_under_one_name_are_not_guessed_between(tmp_path, slurm_says):
    slurm_says(squeue="4711\\n4712\\n", sacct="4711_0\\n4712_0\\n")
    assert executors.find_submitted(submission(tmp_path), "F") is None


@pytest.mark.parametrize(
    "doc",
    [
        {"job_name": "x; scancel -u root", "array_index": 0},
        {"job_name": NAME, "array_index": -1},
        {"job_name": NAME, "array_index": True},
        {"job_name": NAME},
        ["not", "a", "mapping"],
    ],
)
def test_a_tampered_submission_file_asks_slurm_nothing(tmp_path, slurm_says, doc):
    bin_dir = slurm_says(squeue="4711\\n")
    path = tmp_path / "k.sbatch.json"
    path.write_text(json.dumps(doc))
    assert executors.find_submitted(path, "F") is None
    assert not (bin_dir / "squeue.args").exists()
