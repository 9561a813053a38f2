"""The device check's summary: every target with its verdict, every part with its status, the figures.

`build_summary` is computed from whatever the parts left (records, part results) each time the check
publishes, so a run cut short still states every target: met, not met, or not measured. Standard
library only.
"""

from __future__ import annotations

from typing import Any

import device_cells as dc
import device_predictions as dp

SCHEMA = "ditbench.device_check/1"
DRY_BANNER = (
    "DRY RUN on a CPU: tiny stand-in cells in the same control flow. The figures test the wiring and "
    "say nothing about a GPU; the verdicts against the H200 anchors are meaningless here."
)


def _by_part(records: dict[str, list[dict]], part: str) -> list[dict]:
    return records.get(part) or []


def targets(records: dict[str, list[dict]], table: dict, dry: bool) -> dict[str, list[dict]]:
    """Every target the check states, each with its verdict."""
    matched = _by_part(records, "matched")
    out: dict[str, list[dict]] = {
        "matched": [
            dc.anchor_verdict(a, dc.find_record(matched, a.stand_in if dry else a.cell), dry)
            for a in dc.MATCHED
        ],
        "compiled": [
            dc.anchor_verdict(
                dc.COMPILED,
                dc.find_record(
                    _by_part(records, "compiled"), dc.COMPILED.stand_in if dry else dc.COMPILED.cell
                ),
                dry,
            )
        ],
        "card_24gb": [],
        "planner": [],
    }
    card = _by_part(records, "suite_24gb")
    for i, (cell, expected, stand_in) in enumerate(dc.EXPECT_24GB):
        record = dc.find_record(card, stand_in if dry else cell)
        out["card_24gb"].append(dc.expectation_verdict(expected, record, smoke=i == dc.SMOKE_CELL))
    for part in ("matched", "compiled", "suite_24gb"):
        for record in _by_part(records, part):
            if record.get("status") not in ("ok", "oom"):
                continue
            config = record.get("config") or {}
            row = dc.planner_verdict(dp.lookup(table, config), record)
            row["card"] = dp.planned_card(config)
            out["planner"].append(row)
    return out


def counts(all_targets: dict[str, list[dict]]) -> dict[str, int]:
    tally = dict.fromkeys((dc.MET, dc.NOT_MET, dc.NOT_MEASURED), 0)
    for rows in all_targets.values():
        for row in rows:
            tally[row["verdict"]] += 1
    return tally


def build_summary(meta: dict, parts: list[dict], records: dict[str, list[dict]], table: dict) -> dict:
    dry = meta["dry_run"]
    found = targets(records, table, dry)
    return {
        "schema": SCHEMA,
        **meta,
        "banner": DRY_BANNER if dry else None,
        "predictions": {
            "file": "benchmarks/device_predictions.json",
            "fingerprint": table.get("fingerprint"),
            "current": table.get("fingerprint") == meta.get("code_fingerprint"),
            "made_with": table.get("made_with"),
            "how": "made ahead with benchmarks/device_predictions.py (ditbench.plan.predict_cell), committed",
        },
        "parts": parts,
        "targets": found,
        "verdicts": counts(found),
    }


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def _f(value: Any, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _matched_table(rows: list[dict]) -> list[str]:
    lines = [
        "| cell | img/s | official | ratio | peak alloc GiB | official | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        note = f" ({r['why']})" if r.get("why") else ""
        lines.append(
            f"| {r['target'].split(':')[0]} | {_f(r['images_per_s'])} | {r['anchor']['img_s']:g} | "
            f"{_f(r.get('speed_ratio'), '.2f')} | {_f(r['peak_alloc_gib'], '.2f')} | "
            f"{r['anchor']['peak_alloc_gib']:g} | {r['verdict']}{note} |"
        )
    return lines


def _planner_table(rows: list[dict]) -> list[str]:
    lines = [
        "| cell | card | measured peak alloc GiB | predicted | error | predicted fit | verdict "
        "| steps/s measured | predicted | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        error = "-" if r.get("error_gib") is None else f"{r['error_pct']:+.1f}% ({r['error_gib']:+.2f} GiB)"
        fit = r.get("predicted_status") or "-"
        if "fit_agrees" in r:
            fit += f" ({'agrees' if r['fit_agrees'] else 'DISAGREES'}: {r['measured_status']})"
        speed_error = "-" if r.get("speed_error_pct") is None else f"{r['speed_error_pct']:+.1f}%"
        if r.get("speed_within_band") is False:
            speed_error += " (outside the band)"
        lines.append(
            f"| {r['cell']} | {r['card'] or 'CPU'} | {_f(r['measured_gib'], '.2f')} | "
            f"{_f(r['predicted_gib'], '.2f')} | {error} | {fit} | {r['verdict']} | "
            f"{_f(r.get('measured_steps_per_s'), '.2f')} | {_f(r.get('predicted_steps_per_s'), '.2f')} | "
            f"{speed_error} |"
        )
    return lines


def _card_table(rows: list[dict]) -> list[str]:
    lines = ["| cell | expected | status | fits_budget | smoke | verdict |", "|---|---|---|---|---|---|"]
    for r in rows:
        smoke = r.get("smoke")
        smoke_text = "-" if not smoke else f"{smoke.get('steps')} steps, {smoke.get('status') or 'ok'}"
        note = f" ({r['why']})" if r.get("why") else ""
        lines.append(
            f"| {r['cell'] or '-'} | {r['expected']} | {r.get('status') or '-'} | {r.get('fits_budget')} | "
            f"{smoke_text} | {r['verdict']}{note} |"
        )
    return lines


def _parts_table(parts: list[dict]) -> list[str]:
    lines = ["| part | status | seconds | H200 expected | cap s | note |", "|---|---|---|---|---|---|"]
    for p in parts:
        reason = (p.get("reason") or "").replace("|", "/").replace("\n", " ")[:200]
        cap = _f(p.get("cap_s"), ".0f")
        expected = "-" if not p.get("expected_s") else "{:g}-{:g}".format(*p["expected_s"])
        lines.append(
            f"| {p['name']} | {p['status']} | {_f(p.get('seconds'))} | {expected} | {cap} | {reason} |"
        )
    return lines


def _figures(parts: list[dict]) -> list[str]:
    by = {p["name"]: p.get("figures") or {} for p in parts}
    lines: list[str] = []
    env = by.get("env", {}).get("matmul")
    if env:
        lines.append(
            "- matmul TFLOP/s (measured vs the anchor run's): "
            + ", ".join(f"{p} {v['measured']} vs {v['anchor']}" for p, v in env.items())
        )
    fid = by.get("fid")
    if fid and fid.get("end_to_end_s") is not None:
        s = fid["settings"]
        lines.append(
            f"- FID: {s['n']:,} samples ({s['size']} px) vs {s['ref_n']:,} reference images (cached): "
            f"{fid['end_to_end_s']} s end to end, features at {fid['sample_features_img_s']} img/s "
            f"(anchor {dc.INCEPTION_IMG_S:g} img/s), network {fid['inception'].get('name')} "
            f"(official: {fid['inception'].get('official')}), cache hit: {fid['reference_cache_hit']}"
        )
    ddp = by.get("ddp")
    if ddp and ddp.get("ddp_overhead_pct") is not None:
        s = ddp["settings"]
        lines.append(
            f"- DDP at world size 1 ({s['model']} {s['precision']} bs{s['batch']}, {ddp['backend']}): "
            f"{ddp['step_ms_plain']} ms bare, {ddp['step_ms_ddp']} ms wrapped "
            f"({ddp['ddp_overhead_pct']:+.1f}%)"
        )
    smp = by.get("sampling")
    if smp and smp.get("images_per_s") is not None:
        s = smp["settings"]
        lines.append(
            f"- sampling {s['model']} {s['size']} px {s['precision']}, {s['steps']} DDPM steps, cfg 1.5, "
            f"batch {s['batch']}: {smp['images_per_s']:.3f} img/s ({smp['ms_per_step']} ms per step)"
        )
    for name in ("variants",):
        for cell in by.get(name, {}).get("cells", []):
            lines.append(
                f"- {name}: {cell['cell_name']}: {cell['status']}, {_f(cell.get('images_per_s'))} img/s"
            )
    return lines


def markdown(summary: dict) -> str:
    machine = summary.get("machine") or {}
    gpu = (machine.get("gpu") or {}).get("name") or "no GPU"
    v = summary["verdicts"]
    out = [f"# ditbench device check: {gpu}", ""]
    if summary.get("banner"):
        out += [f"**{summary['banner']}**", ""]
    out += [
        f"Started {summary['started_at']}, git {summary.get('git_sha') or '?'}, "
        f"torch {machine.get('torch', '?')}; "
        f"{summary['elapsed_s']:.0f} s of a {summary['deadline_s']:.0f} s deadline"
        + ("" if summary["finished"] else " (cut short: the parts below that did not finish say so)")
        + ".",
        "",
        f"Targets: {v['met']} met, {v['not met']} not met, {v['not measured']} not measured.",
        "",
    ]
    if summary.get("carry"):
        out += [f"Missing on this machine: {summary['carry']}", ""]
    t = summary["targets"]
    out += ["## Matched cells: >= 1.00x the official code's speed at <= its peak memory", ""]
    out += _matched_table(t["matched"]) + [""]
    out += [f"## DiT-XL/2 bf16 compiled, batch 256: >= {dc.COMPILE_TARGET_IMG_S:g} img/s", ""]
    out += _matched_table(t["compiled"]) + [""]
    out += [f"## A suite capped to an {dc.CARD_24GB}", ""] + _card_table(t["card_24gb"]) + [""]
    pred = summary["predictions"]
    stale = "" if pred["current"] else f" The planner's code changed since they were made: `{dp.REGENERATE}`."
    out += [
        "## Planner: predicted vs measured peak allocated (within +-10% or +-0.5 GiB)",
        "",
        f"Predictions {pred['how']}.{stale}",
        "",
    ]
    out += _planner_table(t["planner"]) + [""]
    out += ["## Parts", ""] + _parts_table(summary["parts"]) + [""]
    gpu = [
        f"- {part['name']}: {line}"
        for part in summary["parts"]
        for cell in (part.get("figures") or {}).get("cells", [])
        if (line := gpu_line(cell))
    ]
    if gpu:
        out += ["## The GPU during each cell's window (NVML)", ""] + gpu + [""]
    figures = _figures(summary["parts"])
    if figures:
        out += ["## Other figures", ""] + figures + [""]
    return "\n".join(out)


def gpu_line(cell: dict) -> str | None:
    """'DiT-XL/2 ...: SM 1980 MHz, memory 3201 MHz, power 640 W (medians), 71 C max, 2.1 J/image,
    reasons sw_power_cap 40%' for a cell with GPU figures, else None."""
    g = cell.get("gpu")
    if not g:
        return None
    said = [
        f"{label} {g[key]:g} {unit}"
        for key, label, unit in (
            ("sm_clock_mhz_median", "SM", "MHz"),
            ("mem_clock_mhz_median", "memory", "MHz"),
            ("power_w_median", "power", "W"),
            ("temperature_c_max", "max", "C"),
            ("energy_j_per_image", "energy", "J/image"),
        )
        if isinstance(g.get(key), (int, float))
    ]
    reasons = g.get("clock_event_reasons") or {}
    said.append(
        "clock-event reasons " + (", ".join(f"{r} {100 * v:.0f}%" for r, v in reasons.items()) or "none")
    )
    if g.get("throttled"):
        said.append("NOISY: throttled (" + ", ".join(g["throttled"]) + ")")
    return f"{cell.get('cell_name')}: " + ", ".join(said)
