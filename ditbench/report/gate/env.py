"""Whether two runs come from the same machine and stack: ENV_KEYS (GPU model and count, driver, CUDA,
torch, its thread count; the CPU model for CPU-only runs) must agree for every matched cell that ran.
Host name, Python patch level, kernel, ditbench version and git sha are left out on purpose: runners in
a pool differ in host name, and the code is what a gate tests.
"""

from __future__ import annotations

from typing import Any

from ditbench.core.errors import shorten
from ditbench.core.escape import md_code, md_text
from ditbench.report.gate.inputs import GateRefusal, Row

# torch_threads: a CPU step's time scales with it (the `threads` knob sets it; 1 per CPU process by default)
ENV_KEYS = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "torch_threads")
THREADS_HINT = (
    " The torch thread counts differ: set the `threads` knob (or OMP_NUM_THREADS with threads: auto) "
    "alike on both sides."
)
ENV_KEYS_CPU = ("cpu",)  # only when no GPU was used

Differences = dict[str, tuple[list[str], list[str]]]


def fingerprint(record: dict[str, Any]) -> dict[str, str]:
    env = record.get("env") or {}
    keys = ENV_KEYS if env.get("gpu_name") else ENV_KEYS + ENV_KEYS_CPU
    found = {k: shorten(env.get(k), 120, quote=False) for k in keys}
    if not env.get("gpu_name"):  # a CPU cell runs the same code in torch's CPU and CUDA builds
        found["torch"] = found["torch"].split("+")[0]
        del found["cuda"]
    return found


def _build(record: dict[str, Any]) -> dict[str, str]:
    """The torch build of a CPU-only record (`cpu`, `cu130`, or `none named`, and the CUDA it was built
    for); GPU records have none: there the build is the `torch` and `cuda` keys themselves."""
    env = record.get("env") or {}
    if env.get("gpu_name"):
        return {}
    local = str(env.get("torch") or "").partition("+")[2]
    return {
        "torch build": shorten(local, 40, quote=False) if local else "none named",
        "cuda": shorten(env.get("cuda"), 40, quote=False),
    }


def ran(record: dict[str, Any]) -> bool:
    """Whether the cell ran: an unsupported or skipped one never started, so its env (null now, the
    parent's in older records) says nothing of where a measurement was made."""
    return record.get("status") not in ("unsupported", "skipped")


def differences(pairs: list[tuple[Row, Row]], of=fingerprint) -> Differences:
    """key -> (base values, new values) for fingerprint keys that differ between matched cells that ran."""
    diffs: Differences = {}
    for b, n in pairs:
        if not (ran(b.record) and ran(n.record)):
            continue
        fb, fn = of(b.record), of(n.record)
        for key in sorted(set(fb) | set(fn)):
            vb, vn = fb.get(key, "None"), fn.get(key, "None")
            if vb != vn:
                bv, nv = diffs.setdefault(key, ([], []))
                if vb not in bv:
                    bv.append(vb)
                if vn not in nv:
                    nv.append(vn)
    return diffs


def named_differences(pairs: list[tuple[Row, Row]]) -> Differences:
    """Differences shown beside the verdicts but never gated: the torch build (CPU vs CUDA wheel of
    one release) of cells that ran on a CPU, where both builds run the same kernels."""
    return differences(pairs, _build)


def _values(values: list[str]) -> str:
    return ", ".join(values[:4]) + (f" (+{len(values) - 4} more)" if len(values) > 4 else "")


class EnvMismatchError(GateRefusal):
    """The two runs come from different hardware or software; comparing them would mislead."""

    title = "refused, environments differ"

    def __init__(self, base_path: str, new_path: str, diffs: Differences):
        self.differences = diffs
        self.base_path, self.new_path = base_path, new_path
        text = "; ".join(f"{k}: {_values(b)} (base) vs {_values(n)} (new)" for k, (b, n) in diffs.items())
        super().__init__(
            f"{base_path} and {new_path} were measured on different hardware or software ({text}). "
            "Speed and memory from different stacks are not comparable, so the gate refuses. Re-measure "
            "the baseline on this machine (docs/gate-in-ci.md says how to refresh a baseline), or pass "
            "--allow-env-mismatch to compare anyway (or, in a policy that gates only what does not depend "
            "on the machine, `environment: may_differ`)." + (THREADS_HINT if "torch_threads" in diffs else "")
        )

    def markdown(self) -> str:
        diffs = self.differences.items()
        rows = [f"| {md_text(k)} | {md_text(_values(b))} | {md_text(_values(n))} |" for k, (b, n) in diffs]
        lines = [
            f"## ⛔ ditbench compare: {self.title}",
            "",
            f"{md_code(self.base_path)} and {md_code(self.new_path)} were measured on different hardware or "
            "software, so "
            "their speed and memory are not comparable. Refresh the baseline on this runner, or pass "
            "`--allow-env-mismatch`." + (THREADS_HINT if "torch_threads" in self.differences else ""),
            "",
            "| key | base | new |",
            "|---|---|---|",
        ]
        return "\n".join(lines + rows) + "\n"
