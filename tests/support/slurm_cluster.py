"""Whether the tests marked `cluster` have a live SLURM cluster (tests/cluster/slurm.sh), and why not.

`tests/cluster/slurm.sh up` writes DIR/env.sh, which exports DITBENCH_SLURM (DIR) and SLURM_CONF;
`.ci/run` sources it, or exports DITBENCH_SLURM_SKIP with the reason the cluster could not start.
"""

from __future__ import annotations

import functools
import os
import subprocess

HOW = "start one with `sudo tests/cluster/slurm.sh up` and `source /tmp/ditbench-slurm/env.sh`"


@functools.cache
def unavailable() -> str | None:
    """None when a cluster answers; else the reason the cluster tests skip."""
    if os.environ.get("DITBENCH_SLURM_SKIP"):
        return f"no SLURM cluster: {os.environ['DITBENCH_SLURM_SKIP']}"
    if not os.environ.get("DITBENCH_SLURM") or not os.environ.get("SLURM_CONF"):
        return f"no SLURM cluster (DITBENCH_SLURM or SLURM_CONF is not set): {HOW}"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no SLURM cluster: sinfo failed ({err}); {HOW}"
    if done.returncode != 0 or not done.stdout.strip():
        return f"no SLURM cluster: sinfo exited {done.returncode}: {done.stderr.strip()[:200]}; {HOW}"
    return None
