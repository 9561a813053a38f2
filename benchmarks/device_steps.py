"""What each part of the device check runs, and how its outcome becomes a status and figures.

Each step takes the Check (device_check.py) and its cap in seconds, runs its command through the
Check's Runner (a process group killed at the cap) and returns {status, reason, figures}. Standard
library only: torch runs in the parts' own processes, never in the driver.
"""

from __future__ import annotations

import json
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import device_cells as dc
import device_predictions as dp
import device_report as report

REPO = Path(__file__).resolve().parents[1]
PACKAGE_MODULES = {"diffusers": "diffusers", "torch-fidelity": "torch_fidelity", "nvidia-ml-py": "pynvml"}
NEEDED_BY = {
    "diffusers": "the sampling part (its VAE); also impl: diffusers cells",
    "torch-fidelity": "no part of this check (ditbench's FID has its own network); pip install wants it",
    "nvidia-ml-py": "NVML in records: device memory and driver (null without it), the window's clocks, "
    "throttle reasons, temperature, power and energy (absent without it)",
}
CARRY_HOW = (
    "carry diffusers as wheels: here, in the repo root, `python3 -m pip download --no-deps "
    "--only-binary=:all: -d .whl diffusers==0.42.1 importlib_metadata`, name .whl in the call's carry "
    "and run benchmarks/gpu_all.sh (it installs .whl into /tmp/site)"
)
FAILED_CELL = ("error", "timeout", "nan_loss")
MIN_FILE_S = 10.0  # a gpu test file given less than this is not started
# The dry run runs the first two files' commands (each a torch start, ~6 s on 2 busy cores): the same
# command lines and the same adding up of reports; the other files differ only in their names.
DRY_GPU_TEST_FILES = 2
REASON_CHARS = 300


def carry_advice(check) -> str | None:
    missing = [d for d in PACKAGE_MODULES if not check.has(d)]
    if not missing:
        return None
    listed = "; ".join(f"{d} (needed by {NEEDED_BY[d]})" for d in missing)
    how = f" To run the sampling part, {CARRY_HOW}." if "diffusers" in missing else ""
    return listed + "." + how


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " / ".join(text[-lines:])[-REASON_CHARS * 2 :]


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_jsonl(path: Path) -> list[dict]:
    """The records of a results.jsonl, the latest per cell, in the order they were written."""
    latest: dict[str, dict] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("cell_id"), str):
            latest.pop(record["cell_id"], None)
            latest[record["cell_id"]] = record
    return list(latest.values())


def _python_part(check, name: str, cap: float) -> tuple[int | None, dict | None]:
    """device_parts.py NAME in its own process: (exit status or None when cut, its JSON result)."""
    out = check.work / f"{name}.json"
    out.unlink(missing_ok=True)
    scratch = check.work / f"{name}_scratch"
    cmd = [check.python, str(Path(__file__).with_name("device_parts.py")), name, "--out", str(out)]
    cmd += ["--work", str(scratch)] + (["--dry-run"] if check.dry else [])
    try:
        rc = check.runner.run(cmd, cap, check.log(name))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the FID part's npz files are gigabytes
    return rc, _read_json(out)


def _outcome(check, name: str, rc: int | None, figures: dict | None, cap: float) -> dict[str, Any]:
    if rc is None:
        return {"status": "timeout", "reason": f"cut at its cap of {cap:.0f} s", "figures": figures}
    if rc != 0 or figures is None:
        return {"status": "error", "reason": f"exit {rc}: {_tail(check.log(name))}", "figures": figures}
    return {"status": "ok", "reason": None, "figures": figures}


def step_preflight(check, cap: float) -> dict[str, Any]:
    """First what needs no process: predictions made for today's code, a plan that fits its deadline
    (a refusal here costs the GPU call seconds); then the machine and its packages."""
    gates = check.gates()
    problems = [g["problem"] for g in gates.values() if g["problem"]]
    if problems:
        check.stop_reason = "the preflight refused: " + "; ".join(problems)
        return {"status": "failed", "reason": " / ".join(problems), "figures": {"gates": gates}}
    rc, info = _python_part(check, "preflight", cap)
    if info is not None:
        check.preflight = info
        info["packages_usable"] = {d: check.has(d) for d in PACKAGE_MODULES}
        info["without"] = sorted(check.without)
        info["gates"] = gates
    result = _outcome(check, "preflight", rc, info, cap)
    if result["status"] != "ok":
        check.stop_reason = "the preflight did not finish"
        return result
    if not check.dry and not info.get("cuda_available"):
        check.stop_reason = "no CUDA device is visible"
        return {
            **result,
            "status": "failed",
            "reason": "no CUDA device is visible: this check needs one (--dry-run runs it on a CPU)",
        }
    return result


def step_env(check, cap: float) -> dict[str, Any]:
    out = check.work / "env.json"
    cmd = [check.python, "-m", "ditbench", "env", "--measure-peak", "--json"]
    rc = check.runner.run(cmd, cap, check.log("env"), stdout=out)
    result = _outcome(check, "env", rc, _read_json(out), cap)
    figures = result["figures"]
    if figures:
        measured = figures.get("measured_matmul_tflops") or {}
        figures["matmul"] = {
            p: {"measured": v, "anchor": dc.MATMUL_TFLOPS[p], "ratio": round(v / dc.MATMUL_TFLOPS[p], 3)}
            for p, v in measured.items()
            if p in dc.MATMUL_TFLOPS
        }
    return result


def gpu_test_files(root: Path) -> list[str]:
    """Test files that hold gpu-marked tests (only those are collected: others may import packages the
    GPU machine lacks)."""
    return sorted(
        str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text()
    )


def junit_counts(path: Path) -> dict[str, Any] | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in root.iter("testcase"):
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                message = (node.get("message") or "")[:REASON_CHARS]
                failed.append(f"{case.get('classname')}::{case.get('name')}: {message}")
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    total["failed_tests"] = failed
    return total


def gpu_test_commands(python: str, files: list[str], work: Path) -> list[tuple[str, list[str], Path]]:
    """(file, pytest command, its junit XML) per file: each file in a process of its own, so one
    file's CUDA context, cached blocks and cuBLAS workspaces are not another's baseline."""
    out = []
    for i, name in enumerate(files):
        xml = work / "gpu_tests" / f"{i:02d}_{Path(name).stem}.xml"
        cmd = [python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
        out.append((name, [*cmd, f"--junitxml={xml}", name], xml))
    return out


def step_gpu_tests(check, cap: float) -> dict[str, Any]:
    end = time.monotonic() + cap
    found = gpu_test_files(REPO)
    files = found[:DRY_GPU_TEST_FILES] if check.dry else found
    log = check.log("gpu_tests")
    total = dict.fromkeys(("tests", "failures", "errors", "skipped", "passed"), 0)
    total["failed_tests"] = []
    per_file, problems, cut = {}, [], None
    for name, cmd, xml in gpu_test_commands(check.python, files, check.work):
        left = end - time.monotonic()
        if left < MIN_FILE_S:
            per_file[name] = "not run"
            cut = cut or name
            continue
        xml.parent.mkdir(parents=True, exist_ok=True)
        rc = check.runner.run(cmd, left, log)
        counts = junit_counts(xml)
        if rc is None:
            cut = cut or name
        if counts is None:
            per_file[name] = "cut" if rc is None else f"exit {rc}, no report"
            if rc is not None:
                problems.append(f"{name}: exit {rc}, no report: {_tail(log)}")
            continue
        for k, v in counts.items():
            total[k] += v
        bad = counts["failures"] + counts["errors"]
        per_file[name] = f"{counts['passed']} passed, {bad} failed, {counts['skipped']} skipped" + (
            " (cut)" if rc is None else ""
        )
        if rc not in (0, 5, None) and not bad:
            problems.append(f"{name}: exit {rc}: {_tail(log)}")
    figures = {"files": files, "files_found": found, "per_file": per_file, **total}
    bad = total["failures"] + total["errors"]
    summary = f"{total['passed']} passed, {bad} failed, {total['skipped']} skipped"
    if cut:
        reason = f"cut at its cap of {cap:.0f} s in {cut}; {summary}"
        return {"status": "timeout", "reason": reason, "figures": figures}
    if problems:
        return {"status": "error", "reason": "; ".join(problems)[: REASON_CHARS * 2], "figures": figures}
    return {"status": "ok" if bad == 0 else "failed", "reason": summary, "figures": figures}


def cell_figures(record: dict) -> dict[str, Any]:
    m = record.get("metrics") or {}
    smoke = record.get("smoke") or {}
    return {
        "cell_name": record.get("cell_name"),
        "status": record.get("status"),
        "reason": (record.get("reason") or "")[:REASON_CHARS] or None,
        "images_per_s": m.get("images_per_s"),
        "step_ms_median": (m.get("step_ms") or {}).get("median"),
        "peak_mem_allocated_gib": m.get("peak_mem_allocated_gib"),
        "peak_mem_reserved_gib": m.get("peak_mem_reserved_gib"),
        "cpu_peak_alloc_gib": m.get("cpu_peak_alloc_gib"),
        "fits_budget": m.get("fits_budget"),
        "mfu": (m.get("mfu") or {}).get("value"),
        "noisy": m.get("noisy"),
        "smoke": {k: smoke.get(k) for k in ("steps", "status", "first_mean", "last_mean")} if smoke else None,
        "duration_s": record.get("duration_s"),
        **({"gpu": gpu} if (gpu := gpu_figures(m)) else {}),
    }


def gpu_figures(m: dict) -> dict[str, Any]:
    """What NVML saw of the GPU during the cell's window (bench.cell.gpu_meter): only what was recorded."""
    w = m.get("gpu_window") if isinstance(m.get("gpu_window"), dict) else {}
    out = {f"{k}_median": w[k].get("median") for k in ("sm_clock_mhz", "mem_clock_mhz", "power_w") if k in w}
    if "temperature_c" in w:
        out["temperature_c_max"] = w["temperature_c"].get("max")
    if "clock_event_reasons" in w:
        out["clock_event_reasons"] = w["clock_event_reasons"]
    out.update({k: m[k] for k in ("energy_j", "energy_j_per_image") if k in m})
    throttle = (m.get("noise") or {}).get("gpu_throttle")
    if throttle is not None:
        out["throttled"] = throttle
    return out


def run_suite(check, part: str, suite: dict, cap: float, env: dict | None = None) -> dict[str, Any]:
    """`ditbench run` of a suite written for this part (JSON is YAML); its records become the part's."""
    path = check.work / f"{suite['name']}.yaml"
    path.write_text(json.dumps(suite, indent=1) + "\n")
    out = check.work / "runs" / suite["name"]
    cmd = [check.python, "-m", "ditbench", "run", str(path), "--out", str(out), "--no-progress"]
    cmd += ["--timeout-s", str(max(1, int(cap)))]
    rc = check.runner.run(cmd, cap, check.log(part), env=env)
    records = read_jsonl(out / "results.jsonl")
    check.records[part] = records
    figures = {"cells": [cell_figures(r) for r in records], "expected_cells": 1 + len(suite["include"])}
    for line in filter(None, map(report.gpu_line, figures["cells"])):
        print(f"  GPU {line}", flush=True)  # clocks, throttling and energy: read at once from the log
    failed = [f"{r.get('cell_name')}: {r.get('status')}" for r in records if r.get("status") in FAILED_CELL]
    if rc is None:
        return {
            "status": "timeout",
            "reason": f"cut at its cap of {cap:.0f} s with {len(records)} cell(s) done",
            "figures": figures,
        }
    if rc != 0:
        return {"status": "error", "reason": f"exit {rc}: {_tail(check.log(part))}", "figures": figures}
    if failed or len(records) < figures["expected_cells"]:
        return {"status": "failed", "reason": "; ".join(failed) or "cells missing", "figures": figures}
    return {"status": "ok", "reason": None, "figures": figures}


def step_matched(check, cap: float) -> dict[str, Any]:
    return run_suite(check, "matched", dc.matched_suite(check.dry), cap)


def step_suite_24gb(check, cap: float) -> dict[str, Any]:
    env = {"DITBENCH_INJECT_FAULT": dc.DRY_OOM_FAULT} if check.dry else None
    return run_suite(check, "suite_24gb", dc.suite_24gb(check.dry), cap, env)


def step_compiled(check, cap: float) -> dict[str, Any]:
    return run_suite(check, "compiled", dc.compiled_suite(check.dry), cap)


def step_variants(check, cap: float) -> dict[str, Any]:
    speed = (check.preflight or {}).get("speed_work") or {}
    backends = [b for b in speed.get("attention_backends", []) if b != "sdpa"]
    modes, knob = speed.get("compile_modes") or [], speed.get("compile_mode_knob")
    cells = dc.variant_cells(check.dry, backends, modes, knob)
    if not cells:
        return {
            "status": "not_provided",
            "reason": f"the knobs offer attention {', '.join(speed.get('attention_backends') or ['?'])} and "
            f"{'compile modes ' + ', '.join(modes) if modes else 'no compile mode'}: nothing beyond the "
            "defaults to measure",
            "figures": speed,
        }
    return run_suite(check, "variants", dc.variants_suite(check.dry, cells), cap)


def step_python(name: str):
    def step(check, cap: float) -> dict[str, Any]:
        rc, figures = _python_part(check, name, cap)
        return _outcome(check, name, rc, figures, cap)

    return step


def step_planner(check, cap: float) -> dict[str, Any]:
    table = check.table()
    rows = report.targets(check.records, table, check.dry)["planner"]
    compared = [r for r in rows if r["verdict"] != dc.NOT_MEASURED]
    figures = {"rows": rows, "fingerprint_current": table.get("fingerprint") == dp.fingerprint()}
    if not table.get("predictions"):
        return {
            "status": "failed",
            "reason": f"no predictions file (run {dp.REGENERATE})",
            "figures": figures,
        }
    if not compared:
        return {
            "status": "failed",
            "reason": "no measured cell to compare with a prediction",
            "figures": figures,
        }
    outside = [r["cell"] for r in compared if r["verdict"] != dc.MET]
    reason = f"{len(compared) - len(outside)} of {len(compared)} within +-10% / +-0.5 GiB"
    speeds = sorted(abs(r["speed_error_pct"]) for r in rows if r.get("speed_error_pct") is not None)
    if speeds:  # the time model against the measured steps/s (shown; the memory verdict decides)
        import statistics

        median = statistics.median(speeds)
        inside = sum(bool(r.get("speed_within_band")) for r in rows)
        reason += (
            f"; speed: median |error| {median:.1f}%, worst {speeds[-1]:.1f}% over {len(speeds)} cells, "
            f"{inside} within the band"
        )
    return {"status": "ok", "reason": reason, "figures": figures}


STEPS = {
    "preflight": step_preflight,
    "env": step_env,
    "gpu_tests": step_gpu_tests,
    "matched": step_matched,
    "suite_24gb": step_suite_24gb,
    "fid": step_python("fid"),
    "compiled": step_compiled,
    "variants": step_variants,
    "ddp": step_python("ddp"),
    "sampling": step_python("sampling"),
    "planner": step_planner,
}
