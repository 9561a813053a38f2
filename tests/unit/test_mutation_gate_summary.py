"""report/gate/summary.py checked part by part (issue 27, mutation testing).

Each expectation is the markdown written out here from the summary's stated format: the head (verdict,
counts, environment), the sections per verdict, the notes, the capped "All cells" table and the
policy paragraph. Comparisons are built by hand, so every number shown is one the test chose.
"""

from __future__ import annotations

import pytest

from ditbench.report.gate.policy import Override, Policy, Rule
from ditbench.report.gate.result import CellResult, Comparison, MetricDelta
from ditbench.report.gate.summary import (
    HEADER,
    MAX_LISTED_CELLS,
    MAX_SUMMARY_ROWS,
    _all_cells,
    _change,
    _fmt,
    _head,
    _label,
    _names,
    _notes,
    _pairs,
    _policy_line,
    _reasons_once,
    _sections,
    _status_text,
    _value,
    summary_markdown,
)

POLICY_TEXT = (
    "a timing change is a regression only if its 95% bootstrap interval (of the ratio of median step times, "
    "1000 resamples) lies wholly beyond the threshold and the samples differ by a Mann-Whitney U test at "
    "p<{alpha} (with ≥{n} samples a side); an interval that straddles the threshold is inconclusive (policy "
    "`inconclusive: {inc}`: exits {exit}), and so is a pass whose minimum detectable effect (80% power) "
    "exceeds the threshold. Where both runs have repeats (`run --repeats K`) the samples are "
    "the repeats' per-process median step times, which sample process-level noise (start-up, clocks, "
    "machine load); else they are one run's per-step times, which sample only step-to-step noise, so the "
    "interval is narrow. Memory and loss are gated on the threshold alone; a quality change must also "
    "exceed {k}σ of the combined spread (each side's seeds' or its bootstrap's, whichever is larger)."
)
DEFAULT_RULES = "images/s -5%, peak allocated +2%, peak reserved +5%, FID +2%, Inception Score -2%"


def delta(metric="images_per_s", label="images/s", b=400.0, n=300.0, change=-25.0, t=5.0, verdict="regression",  # noqa: E501
          significance="p=0.001", direction="worse", weak=False, weak_reason=None, step=None):  # fmt: skip
    return MetricDelta(metric, label, b, n, change, t, verdict, significance, direction=direction, weak=weak,
                       weak_reason=weak_reason, step=step)  # fmt: skip


def cell(name="DiT-S/8 fp32", verdict="pass", base="ok", new="ok", metrics=(), cell_id=None, **kw):
    return CellResult(cell_id or f"id-{name}", name, verdict, base, new, metrics=list(metrics), **kw)


def comparison(cells, policy=None, env=None, **kw):
    return Comparison("b.jsonl", "n.jsonl", cells, {}, policy or Policy(), env or {}, **kw)


# ------------------------------------------------------------------------------------------ values


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (1e15, "1e+15"),
        (-2.5e15, "-2.5e+15"),
        (999_999_999_999_999.0, "999,999,999,999,999"),
        (123_456.7, "123,457"),
        (1000, "1,000"),
        (-1500, "-1,500"),
        (999.96, "1000.0"),
        (10, "10.0"),
        (-12.34, "-12.3"),
        (9.87654, "9.88"),
        (0.001234, "0.00123"),
    ],
)
def test_numbers_are_shown_by_size(x, text):
    assert _fmt(x) == text


def test_memory_reads_in_gib_or_mib_and_other_metrics_by_size():
    assert _value("peak_mem_allocated_gib", 12.4237) == "12.42 GiB"
    assert _value("peak_mem_reserved_gib", 0.5) == "512 MiB"
    assert _value("images_per_s", 1234.6) == "1,235"
    assert _value("fid", 0.5) == "0.5"
    assert _value("not_a_metric", 5) == "5"


def test_a_change_is_signed_to_one_decimal_or_from_zero():
    assert _change(delta(change=12.345)) == "+12.3%"
    assert _change(delta(change=-0.04)) == "-0.0%"
    assert _change(delta(change=None)) == "from 0"


def test_a_quality_label_names_its_step():
    assert _label(delta(label="FID")) == "FID"
    assert _label(delta(label="FID", step=7)) == "FID @ step 7"
    assert _label(delta(label="FID", step=0)) == "FID @ step 0"


def test_cell_names_are_listed_up_to_ten():
    assert MAX_LISTED_CELLS == 10
    cells = [cell(f"c{i}") for i in range(11)]
    ten = ", ".join(f"`c{i}`" for i in range(10))
    assert _names(cells[:10]) == ten
    assert _names(cells) == ten + "…"
    assert _names([cell("a|b <i>")]) == "`a\\|b <i>`"  # a code span: `<` is text there, `|` a table's


def test_each_reason_is_stated_once_with_its_count():
    refs, notes = _reasons_once(["x", "", "y", "x"])
    assert refs == ["[1]", "", "[2]", "[1]"]
    assert notes == ["", "[1] x (2 cells)<br>[2] y (1 cell)"]
    assert _reasons_once([]) == ([], [])
    assert _reasons_once(["", ""]) == (["", ""], [])
    assert _reasons_once(["a|b", "a|b", "a|b"]) == (["[1]", "[1]", "[1]"], ["", "[1] a\\|b (3 cells)"])


def test_a_status_is_one_word_unless_it_changed_or_one_side_lacks_it():
    assert _status_text(cell(base=None, new="ok")) == "new (ok)"
    assert _status_text(cell(base="failed", new=None)) == "missing (was failed)"
    assert _status_text(cell(base="ok", new="ok")) == "ok"
    assert _status_text(cell(base="ok", new="oom")) == "ok → oom"


def test_pairs_name_each_key_with_both_sides_values():
    assert _pairs({"driver": (["550", "551"], ["560"]), "cuda": (["12.4"], ["12.6"])}) == (
        "driver: 550, 551 → 560; cuda: 12.4 → 12.6."
    )


# ------------------------------------------------------------------------------------------ head


def test_a_pass_head_counts_the_matched_cells_and_names_the_environment():
    c = comparison(
        [
            cell("A", metrics=[delta(verdict="unchanged"), delta(verdict="unchanged")]),
            cell("B", "improved", metrics=[delta(verdict="improvement")]),
            cell("C", "only in new", None, "ok"),
            cell("D", "only in base", "ok", None),
        ],
        env={"gpu_name": "H100", "torch": "2.5.0"},
    )
    assert _head(c) == [
        "## ✅ ditbench compare: no regression",
        "",
        "Base `b.jsonl` vs new `n.jsonl`: 2 cells matched (1 improved, 1 pass, 1 only in base, 1 only in new)"
        "; 3 values compared.",
        "Environment: gpu_name H100, torch 2.5.0.",
    ]


def test_regressions_are_counted_in_the_head():
    one = comparison([cell("A", "regression")])
    assert _head(one)[0] == "## ❌ ditbench compare: 1 regression"
    assert _head(one)[3] == "Environment: unknown."
    two = comparison([cell("A", "regression"), cell("B", "new failure", "ok", "failed")])
    assert _head(two)[0] == "## ❌ ditbench compare: 2 regressions"
    assert _head(two)[2] == (
        "Base `b.jsonl` vs new `n.jsonl`: 2 cells matched (1 regression, 1 new failure); 0 values compared."
    )


def test_missing_cells_failing_the_gate_say_so_in_the_head():
    c = comparison([cell("A", "only in base", "ok", None)], Policy(fail_on_missing=True))
    assert _head(c)[0] == "## ❌ ditbench compare: cells or quality steps missing from the new run"


@pytest.mark.parametrize(
    ("mapped", "head"),
    [
        ("inconclusive", "## ❔ ditbench compare: 2 inconclusive"),
        ("pass", "## ✅ ditbench compare: 2 inconclusive (counted as pass by the policy)"),
        ("fail", "## ❌ ditbench compare: 2 inconclusive (counted as failing by the policy)"),
    ],
)
def test_inconclusive_cells_head_the_summary_as_the_policy_maps_them(mapped, head):
    c = comparison(
        [cell("A", "inconclusive"), cell("B", "inconclusive"), cell("C")], Policy(inconclusive=mapped)
    )
    assert _head(c)[0] == head


@pytest.mark.parametrize(
    ("environment", "why"),
    [
        ("may_differ", "the policy says `environment: may_differ`"),
        ("must_match", "with --allow-env-mismatch"),
    ],
)
def test_environment_differences_and_notes_are_named_under_the_head(environment, why):
    c = comparison([cell()], Policy(environment=environment), env_notes={"torch build": (["cu130"], ["cpu"])})
    c.env_differences = {"driver": (["550"], ["560", "561"])}
    assert _head(c)[4:] == [
        "",
        f"> ⚠️ **Environments differ** (compared anyway, {why}): driver: 550 → 560, 561.",
        "",
        "> ℹ️ Named, not gated: torch build: cu130 → cpu. (CPU cells run the same kernels in torch's CPU and "
        "CUDA builds of one release).",
    ]


def test_unofficial_inception_weights_are_flagged_and_official_or_unknown_ones_are_not():
    banner = [
        "",
        "> ⚠️ **Not the official Inception weights**: the FID / IS compared here are not comparable with "
        "papers (both runs used the same weights, so they are comparable with each other).",
    ]
    assert _head(comparison([cell()], inception_official=False))[4:] == banner
    assert _head(comparison([cell()], inception_official=True))[4:] == []
    assert _head(comparison([cell()], inception_official=None))[4:] == []


# ------------------------------------------------------------------------------------------ sections


def test_each_verdict_has_its_table():
    c = comparison(
        [
            cell(
                "A|1",
                "regression",
                metrics=[
                    delta(significance="p=0.001 <x>", weak=True),
                    delta(
                        "peak_mem_allocated_gib",
                        "peak allocated",
                        2.0,
                        0.75,
                        -62.5,
                        2.0,
                        "improvement",
                        "threshold",
                        "better",
                    ),  # fmt: skip
                    delta("fid", "FID", 10.0, 12.0, 20.0, 2.0, "inconclusive", "within noise", step=5),
                    delta("step_ms", "step ms (median)", 100.0, 120.0, 20.0, 10.0, "noise", "p=0.2"),
                    delta(
                        "inception_score",
                        "Inception Score",
                        100.0,
                        150.0,
                        50.0,
                        2.0,
                        "noise",
                        "within noise",
                        "better",
                    ),  # fmt: skip
                    delta(verdict="unchanged"),
                ],
            ),
        ]
    )
    assert _sections(c) == [
        "",
        "### Regressions",
        "",
        *HEADER,
        "| A\\|1 | images/s | 400.0 | 300.0 | -25.0% | -5% | p=0.001 &lt;x> · ⚠️ weak |",
        "",
        "### Inconclusive (the interval of the change straddles the threshold)",
        "",
        *HEADER,
        "| A\\|1 | FID @ step 5 | 10.0 | 12.0 | +20.0% | +2% | within noise |",
        "",
        "### Worse beyond the threshold, but not significant (not counted)",
        "",
        *HEADER,
        "| A\\|1 | step ms (median) | 100.0 | 120.0 | +20.0% | +10% | p=0.2 |",
        "",
        "### Improvements",
        "",
        *HEADER,
        "| A\\|1 | peak allocated | 2.00 GiB | 768 MiB | -62.5% | +2% | threshold |",
        "",
        "### Better beyond the threshold, but not significant",
        "",
        *HEADER,
        "| A\\|1 | Inception Score | 100.0 | 150.0 | +50.0% | -2% | within noise |",
    ]
    assert HEADER == [
        "| cell | metric | base | new | change | threshold | significance |",
        "|---|---|---|---|---|---|---|",
    ]
    assert _sections(comparison([cell(metrics=[delta(verdict="unchanged")])])) == []


def test_status_changes_are_tabled_with_each_reason_once():
    c = comparison(
        [
            cell("A", "new failure", "ok", "failed", reason="CUDA OOM"),
            cell("B", "new failure", "ok", "oom", reason="CUDA OOM"),
            cell("C", "fixed", "failed", "ok"),
            cell("D", "no longer measured", "ok", "skipped", reason="not run"),
            cell("E", "still failing", "failed", "failed", reason="boom"),
        ]
    )
    assert _sections(c) == [
        "",
        "### New failures (ok before)",
        "",
        "| cell | status | reason |",
        "|---|---|---|",
        "| A | ok → failed | [1] |",
        "| B | ok → oom | [1] |",
        "",
        "[1] CUDA OOM (2 cells)",
        "",
        "### Fixed (failed before, ok now)",
        "",
        "| cell | status | reason |",
        "|---|---|---|",
        "| C | failed → ok |  |",
        "",
        "### No longer measured (ok before, not run now)",
        "",
        "| cell | status | reason |",
        "|---|---|---|",
        "| D | ok → skipped | [1] |",
        "",
        "[1] not run (1 cell)",
        "",
        "### Still failing",
        "",
        "| cell | status | reason |",
        "|---|---|---|",
        "| E | failed | [1] |",
        "",
        "[1] boom (1 cell)",
    ]


def test_metrics_not_compared_are_tabled_and_capped():
    nc = [{"metric": "mfu", "reason": "is 'x'"}, {"metric": "fid", "reason": "missing"}]
    c = comparison(
        [cell("A", not_compared=nc), cell("B", not_compared=[{"metric": "m|x", "reason": "is 'x'"}])]
    )
    assert _sections(c) == [
        "",
        "### Not compared (allowed by the policy's allow_incomparable)",
        "",
        "| cell | metric | why |",
        "|---|---|---|",
        "| A | mfu | [1] |",
        "| A | fid | [2] |",
        "| B | m\\|x | [1] |",
        "",
        "[1] is 'x' (2 cells)<br>[2] missing (1 cell)",
    ]
    many = comparison([cell(f"c{i}", not_compared=[{"metric": "mfu", "reason": "r"}]) for i in range(152)])
    rows = [line for line in _sections(many) if line.startswith("| c") and not line.startswith("| cell")]
    assert len(rows) == MAX_SUMMARY_ROWS == 150
    assert _sections(many)[-1] == "[1] r (150 cells)"


# ------------------------------------------------------------------------------------------ notes


def test_untested_and_weak_cells_are_named_with_why():
    c = comparison(
        [
            cell("A", untested=True, weak=True, metrics=[delta(weak=True, weak_reason="noisy window")]),
            cell(
                "B",
                weak=True,
                metrics=[delta(weak=True, weak_reason="noise unknown"), delta(weak_reason="x")],
            ),
            cell("C", untested=True),
            cell("D"),
        ],
        Policy(alpha=0.025, min_samples=7),
    )
    assert _notes(c) == [
        "",
        "**Significance not tested** for 2 cell(s) with a change beyond the threshold: fewer than 7 samples "
        "(steps, or repeats) on a side (or too few to reach p<0.025), so the threshold alone decided: `A`, "
        "`C`.",
        "",
        "**Weak verdicts** in 2 cell(s): `A`, `B`. They still count (a noisy cell's timing regression passed "
        "its significance test; a quality change without a known noise crossed its threshold), but "
        "re-measure before acting on them. Why: noise unknown; noisy window.",
    ]


def test_at_most_five_weak_reasons_are_given_in_order():
    metrics = [delta(weak=True, weak_reason=r) for r in ("f", "b", "e", "a", "c", "d", "b", "g|h")]
    line = _notes(comparison([cell("A", weak=True, metrics=metrics)]))[-1]
    assert line.endswith("Why: a; b; c; d; e.")


@pytest.mark.parametrize(("fail", "suffix"), [(False, ""), (True, " (fails the gate: fail_on_missing)")])
def test_cells_on_one_side_only_are_tabled_by_id_and_status(fail, suffix):
    c = comparison(
        [
            cell("A", "only in base", "ok", None, cell_id="a1"),
            cell("B|x", "only in new", None, "failed", cell_id="b2"),
            cell("C", "only in base", "failed", None, cell_id="c3"),
        ],
        Policy(fail_on_missing=fail),
    )
    assert _notes(c) == [
        "",
        f"### Missing from the new run{suffix}",
        "",
        "| cell | cell_id | status |",
        "|---|---|---|",
        "| A | `a1` | ok |",
        "| C | `c3` | failed |",
        "",
        "### New cells (no baseline)",
        "",
        "| cell | cell_id | status |",
        "|---|---|---|",
        "| B\\|x | `b2` | failed |",
    ]
    assert _notes(comparison([cell()])) == []


# ------------------------------------------------------------------------------------------ all cells


def test_all_cells_shows_the_first_four_gated_metrics_changed_cells_first():
    a = cell("A", metrics=[delta(verdict="unchanged", n=410.0, change=2.5)])
    b = cell(
        "B|1", "regression", "ok", "ok", weak=True,
        metrics=[delta(n=300.0), delta("fid", "FID", 10.0, 12.0, 20.0, 2.0, step=3),
                 delta("peak_mem_allocated_gib", "peak allocated", 1.0, 0.5, -50.0, 2.0)],
    )  # fmt: skip
    c = cell("C", "only in new", None, "ok")
    assert _all_cells(comparison([a, b, c])) == [
        "",
        "<details><summary>All cells</summary>",
        "",
        "| cell | status | images/s | peak allocated | peak reserved | FID | verdict |",
        "|---|---|---|---|---|---|---|",
        "| B\\|1 | ok | 300.0 (-25.0%) | 512 MiB (-50.0%) | — | 12.0 (+20.0%) | regression (weak) |",
        "| C | new (ok) | — | — | — | — | only in new |",
        "| A | ok | 410.0 (+2.5%) | — | — | — | pass |",
        "",
        "</details>",
    ]


def test_all_cells_shows_only_gated_metrics():
    policy = Policy(rules={"step_ms": Rule(threshold_pct=10.0)})
    got = _all_cells(
        comparison([cell("A", metrics=[delta("step_ms", "step ms (median)", 10.0, 10.0, 0.0)])], policy)
    )
    assert got[3:6] == [
        "| cell | status | step ms (median) | verdict |",
        "|---|---|---|---|",
        "| A | ok | 10.0 (+0.0%) | pass |",
    ]


def test_all_cells_is_capped_at_150_rows_and_counts_the_rest():
    cells = [cell(f"p{i}") for i in range(150)] + [cell("R", "regression")]
    got = _all_cells(comparison(cells))
    assert got[5] == "| R | ok | — | — | — | — | regression |"  # the changed cell first
    assert len([line for line in got if line.startswith("| p")]) == 149
    assert got[-3:] == ["| … 1 more cells (all pass); see `--json` | | |", "", "</details>"]
    assert _all_cells(comparison(cells[:150]))[-2:] == ["", "</details>"]
    assert len(_all_cells(comparison(cells[:150]))) == 5 + 150 + 2


# ------------------------------------------------------------------------------------------ policy


def test_the_default_policy_is_stated_in_full():
    assert _policy_line(comparison([cell()])) == [
        "",
        f"Policy (defaults): {DEFAULT_RULES}; "
        + POLICY_TEXT.format(alpha="0.01", n=5, inc="inconclusive", exit=3, k="2"),
    ]


@pytest.mark.parametrize(("mapped", "code"), [("pass", 0), ("fail", 1)])
def test_a_policy_file_states_its_own_values(mapped, code):
    policy = Policy(
        rules={"step_ms": Rule(threshold_pct=7.5), "fid": Rule(threshold_pct=1.0)},
        alpha=0.05,
        min_samples=8,
        quality_noise_k=2.5,
        inconclusive=mapped,
        allow_incomparable=frozenset({"mfu", "fid"}),
        source="ci/policy.yaml",
    )
    (blank, line) = _policy_line(comparison([cell()], policy))
    assert line == (
        "Policy (ci/policy.yaml): step ms (median) +7.5%, FID +1%; "
        + POLICY_TEXT.format(alpha="0.05", n=8, inc=mapped, exit=code, k="2.5")
        + " Allowed to go uncompared: fid, mfu."
    )


def test_a_policy_without_metrics_allowing_everything_and_unused_overrides():
    overrides = [Override({"model": "DiT-S/8"}, {}), Override({"a": 1}, {}), Override({"b|c": "[x]"}, {})]
    policy = Policy(rules={}, allow_incomparable=frozenset({"*"}), overrides=overrides)
    line = _policy_line(comparison([cell()], policy, unused_overrides=[0, 2]))[1]
    assert line.startswith("Policy (defaults): no metric; a timing change")
    assert line.endswith(
        "whichever is larger). Allowed to go uncompared: every metric. ⚠️ No compared cell matched "
        "overrides[0] (match {'model': 'DiT-S/8'}); overrides[2] (match {'b\\|c': '\\[x]'}): check its knobs "
        "and values."
    )
    many = Policy(rules={}, overrides=[Override({"i": i}, {}) for i in range(7)])
    line = _policy_line(comparison([cell()], many, unused_overrides=list(range(7))))[1]
    assert "overrides[4] (match {'i': 4}): check" in line and "overrides[5]" not in line


def test_the_summary_is_its_parts_in_order_ending_with_a_newline():
    c = comparison([cell("A", "regression", metrics=[delta()])])
    expected = _head(c) + _sections(c) + _notes(c) + _all_cells(c) + _policy_line(c)
    assert summary_markdown(c) == "\n".join(expected) + "\n"
    assert summary_markdown(c).startswith("## ❌ ditbench compare: 1 regression\n\nBase `b.jsonl`")


def test_the_not_compared_table_follows_the_other_sections():
    nc = [{"metric": "mfu", "reason": "missing"}]
    c = comparison([cell("A", "regression", metrics=[delta()], not_compared=nc)])
    assert _sections(c) == [
        "",
        "### Regressions",
        "",
        *HEADER,
        "| A | images/s | 400.0 | 300.0 | -25.0% | -5% | p=0.001 |",
        "",
        "### Not compared (allowed by the policy's allow_incomparable)",
        "",
        "| cell | metric | why |",
        "|---|---|---|",
        "| A | mfu | [1] |",
        "",
        "[1] missing (1 cell)",
    ]
