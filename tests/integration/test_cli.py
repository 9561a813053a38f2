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
