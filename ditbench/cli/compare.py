"""`ditbench compare BASE NEW`: the regression gate (exit codes and policy format: POLICY_EXAMPLE).
The summary goes to stdout, --summary FILE and $GITHUB_STEP_SUMMARY, so a workflow step needs no glue;
a refusal (exit 2) writes its reason there too."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

from ditbench.core.errors import UserError, shorten
from ditbench.files import outpaths
from ditbench.files.fileio import append_text, write_atomic
from ditbench.records.metrics import IMAGES_PER_S, PEAK_ALLOCATED, default_thresholds, limits, table
from ditbench.report.gate.decide import compare_files
from ditbench.report.gate.inputs import GateRefusal
from ditbench.report.gate.policy import DEFAULT_ALPHA, load_policy
from ditbench.report.gate.result import to_json_text
from ditbench.report.gate.summary import summary_markdown

POLICY_BESIDE = "policy.yaml"
_METRIC_NAMES = textwrap.fill("metrics: " + ", ".join(table()), 100, subsequent_indent="  ")
POLICY_EXAMPLE = f"""\
exit status: 0 pass or improvement, 1 regression (a new failure, or a cell ok in BASE that NEW
skipped or did not run, unless allow_stopped names it; or, with fail_on_missing, missing cells or
quality steps), 3 inconclusive (a timing change whose confidence interval straddles its threshold;
the policy's `inconclusive: pass | fail` maps it to 0 or 1), 2 usage or input error: runs from different GPU /
driver / CUDA / torch without --allow-env-mismatch or the policy's `environment: may_differ` (a
CPU cell's torch build, CPU or CUDA wheel of one release, is named, not gated); a gated value that
cannot be compared (missing on one side, NaN, inf, not a number, bad per-step samples) unless the
policy allows it; an unknown status; quality made with different Inception weights, reference,
sampler or sample count; and a comparison that compared no value at all (a gate never passes by
default).

A regression needs the threshold crossed in the bad direction AND, for timing metrics, the 95%
bootstrap interval of the change (from the ratio of the median step times, seeded) wholly beyond the
threshold and a significant Mann-Whitney U difference of the samples (p < alpha); an interval that
straddles the threshold is inconclusive, and so is a pass whose minimum detectable effect (MDE: from
the interval's width, the change it would see 4 times in 5) exceeds the threshold. When both runs
have repeats (`run --repeats K`), the samples are the repeats' per-process median step times, which
sample process-level noise (start-up, clocks, machine load); else they are one run's per-step times,
which sample step-to-step noise only, so the interval is narrow. With fewer than min_samples samples
a side (5 by default: K >= 5 repeats) the threshold alone decides and the summary says so. Memory
and loss: threshold alone. Quality (the last evaluation both runs have at the same step): |new -
base| must also exceed quality_noise_k * sqrt(spread_base^2 + spread_new^2) (a side's spread: the
larger of its seeds' standard deviation and its bootstrap SE over samples), and the change +- that
bound must lie wholly beyond the threshold (straddling it: inconclusive); with no spread recorded
the threshold decides (weak). A cell whose record says metrics.noisy: true keeps its timing
verdicts, marked weak.

policy file (YAML; every key optional, metrics merge over the defaults):
  alpha: 0.01
  min_samples: 5
  fail_on_missing: false        # true: cells or quality steps of BASE missing from NEW fail the gate
  allow_stopped: [bs=64]        # or true: cells (name substrings, ids) that may stop running
  allow_incomparable: [mfu]     # or true: these may be missing / unusable in a cell (listed, not compared)
  quality_noise_k: 2            # a quality change must exceed k combined spreads (seeds or bootstrap)
  inconclusive: inconclusive    # or pass / fail: what an inconclusive cell does (exit 3 / 0 / 1)
  allow_sample_count_mismatch: false  # true: compare quality at different N (weak: FID bias depends on N)
  environment: must_match       # or may_differ: compare runs from other machines, naming the differences
  metrics:                      # percent the metric may move the wrong way; false turns it off
    {IMAGES_PER_S.name}: 5
    {PEAK_ALLOCATED.name}: {{threshold_pct: 2, min_abs: 0.05}}
    step_ms: 10
    fid: 2
    inception_score: 2
  overrides:                    # per-cell thresholds, matched on config knobs
    - match: {{model: DiT-S/8}}
      metrics: {{{IMAGES_PER_S.name}: 10}}
{_METRIC_NAMES}
allow_incomparable also takes step_samples (bad per-step samples: the test is skipped, the threshold
decides).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = POLICY_EXAMPLE
    parser.add_argument("base", metavar="BASE", help="the baseline results.jsonl (or its run directory)")
    parser.add_argument("new", metavar="NEW", help="the new results.jsonl (or its run directory)")
    parser.add_argument(
        "--policy",
        metavar="POLICY.yaml",
        help="thresholds per metric, significance level, per-cell overrides, what may go uncompared; "
        f"default: the {POLICY_BESIDE} in BASE's folder if there is one (it says how its baseline is "
        f"gated), else {limits(default_thresholds())}, alpha {DEFAULT_ALPHA}".replace("%", "%%"),
    )
    parser.add_argument(
        "--allow-env-mismatch",
        action="store_true",
        help="compare even when GPU, driver, CUDA or torch differ between the runs",
    )
    add_summary_options(parser)


def add_summary_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--summary",
        metavar="FILE",
        help="also write the markdown summary to FILE (e.g. for a pull-request comment)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the full comparison as JSON instead of markdown"
    )


def check_summary_target(summary: str | None, inputs: list[tuple[str, str | None]]) -> None:
    """--summary and $GITHUB_STEP_SUMMARY must not be an input, and the latter must be writable."""
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    outpaths.refuse_output_as_input([("--summary", summary), ("$GITHUB_STEP_SUMMARY", step)], inputs)
    outpaths.step_summary()
    if summary:  # replaced at the end: only a regular file (or nothing) may be there
        outpaths.check_file_target(
            summary, "--summary", writes=("the markdown summary", (".md", ".markdown", ".txt"))
        )


def publish(text: str, summary: str | None) -> None:
    """The markdown to --summary FILE (replaced) and $GITHUB_STEP_SUMMARY (appended)."""
    step_summary = outpaths.step_summary()
    same = summary and step_summary and Path(summary).resolve() == Path(step_summary).resolve()
    where = "--summary"
    try:
        if summary and not same:
            write_atomic(summary, text, "--summary")
        where = "$GITHUB_STEP_SUMMARY"
        if step_summary:  # other steps write there too: append, never replace
            append_text(step_summary, text + "\n", "$GITHUB_STEP_SUMMARY")
    except OSError as err:
        target = summary if where == "--summary" else step_summary
        raise UserError(
            f"cannot write the summary to {where} {shorten(str(target), 200, quote=False)}: "
            f"{err.strerror or err}. Give a writable file path."
        ) from None


def refused(err: GateRefusal, summary: str | None, as_json: bool) -> None:
    """A refusal's reason where the summary would go, and with --json as {"result": "refused", ...}."""
    publish(err.markdown(), summary)
    if as_json:
        reason = " ".join(str(err).split())
        print(json.dumps({"result": "refused", "exit_code": err.exit_code, "reason": reason}, indent=2))


def _policy_path(args: argparse.Namespace) -> str | None:
    """--policy, else the policy file kept beside the baseline (said on stderr), else None (defaults)."""
    if args.policy is not None:
        return args.policy
    base = Path(args.base)
    beside = (base if base.is_dir() else base.parent) / POLICY_BESIDE
    if not beside.is_file():
        return None
    print(
        f"ditbench compare: policy {beside} (beside the baseline; --policy FILE to use another)",
        file=sys.stderr,
    )
    return str(beside)


def run(args: argparse.Namespace) -> int:
    args.policy = _policy_path(args)
    check_summary_target(args.summary, [("BASE", args.base), ("NEW", args.new), ("--policy", args.policy)])
    policy = load_policy(args.policy)
    try:
        result = compare_files(args.base, args.new, policy, args.allow_env_mismatch)
    except GateRefusal as err:
        refused(err, args.summary, args.json)
        raise
    text = summary_markdown(result)
    publish(text, args.summary)
    sys.stdout.write(to_json_text(result) + "\n" if args.json else text)
    return result.exit_code
