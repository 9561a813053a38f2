"""A reader that leaves early (`ditbench suites | head -1`) ends the command quietly, as it does a shell
tool: no error paragraph about the file system, and the shell's exit status for SIGPIPE."""

import subprocess
import sys


def test_a_closed_stdout_ends_the_command_without_an_error():
    proc = subprocess.Popen(
        [sys.executable, "-m", "ditbench", "suites"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # before the command writes anything: its first write meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err.decode()) == (141, "")
