"""The regression gate: compare a new run with a baseline run, cell by cell (`ditbench compare`).

policy.py (thresholds, what may go uncompared), inputs.py (reading the runs; every unusable value
is a problem naming file, line and cell), env.py (same machine and stack), timing.py
(speed/memory/loss, the per-step significance test), paired.py (`ditbench ab`'s paired rounds),
quality.py (FID and the other sample metrics, with their noise), decide.py (the decisions, in
order), result.py (how far each metric moved, what was found, JSON), summary.py (markdown), cli.py.
"""

from ditbench.records.metrics import default_thresholds, table
from ditbench.report.gate.decide import NothingComparedError, compare_files, compare_frames
from ditbench.report.gate.env import EnvMismatchError
from ditbench.report.gate.policy import Policy, load_policy
from ditbench.report.gate.quality import QualityMismatchError
from ditbench.report.gate.summary import summary_markdown

__all__ = [
    "EnvMismatchError",
    "NothingComparedError",
    "Policy",
    "QualityMismatchError",
    "compare_files",
    "compare_frames",
    "default_thresholds",
    "load_policy",
    "summary_markdown",
    "table",
]
