"""`ditbench --help`, `ditbench suites` and each command's --help answer without importing torch
(cli.py imports a command's module only when it runs; the modules they need import torch lazily)."""

import json
import subprocess
import sys

import pytest

from ditbench.cli import COMMANDS

LIGHT = [["--help"], ["suites"], ["suites", "--schema"]] + [[name, "--help"] for name in COMMANDS]

PROBE = """
import json, runpy, sys
sys.argv = ["ditbench", *json.loads(sys.argv[1])]
code = 0
try:
    runpy.run_module("ditbench", run_name="__main__")
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", LIGHT, ids=" ".join)
def test_help_and_suites_do_not_import_torch(argv):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, timeout=120
    )
    result = json.loads(done.stderr.strip().splitlines()[-1])
    assert result == {"code": 0, "torch": False}, done.stderr
