import subprocess
import sys

import pytest

from ditbench.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


@pytest.mark.slow
def test_unknown_command_exits_non_zero():
    proc = subprocess.run(
        [sys.executable, "-m", "ditbench", "no-such-command"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr


@pytest.mark.parametrize("label", ["two\nlines", "", "x" * 65, "tab\there"])
def test_a_bad_run_label_is_one_clean_error(capsys, label):
    with pytest.raises(SystemExit) as exit:
        main(["run", "cpu_smoke", "--label", label, "--dry-run"])
    assert exit.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "argument --label" in err and "is not a label: give 1 to 64 printable characters on one line" in err
    )


def test_a_run_label_is_written_into_each_record_only_when_given():
    from ditbench.bench.inflight import make_record

    context = {
        "suite": "s",
        "run_id": "r",
        "cell_id": "c",
        "cell_name": "n",
        "suite_baseline": {},
        "suite_overrides": {},
        "config": {},
        "started_at": "2026-12-01T00:00:00Z",
    }
    assert make_record({**context, "label": "before-fix"}, {"status": "ok"}, 1.0)["label"] == "before-fix"
    assert "label" not in make_record({**context, "label": None}, {"status": "ok"}, 1.0)
    assert "label" not in make_record(context, {"status": "ok"}, 1.0)
