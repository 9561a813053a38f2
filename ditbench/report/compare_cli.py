"""`ditbench compare BASE NEW`: the regression gate. Exit 0 pass, 1 regression, 2 usage or input error.

The markdown summary goes to stdout (or JSON with --json), to --summary FILE (replaced), and is
appended to $GITHUB_STEP_SUMMARY when GitHub Actions sets it, so a workflow step needs no glue.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ditbench.fileio import write_atomic
from ditbench.report.compare import (
    EnvMismatchError,
    compare_files,
    load_policy,
    refusal_markdown,
    summary_markdown,
    to_json_text,
)

POLICY_EXAMPLE = """\
exit status: 0 no regression, 1 regression (or missing cells with fail_on_missing), 2 usage or input
error, including runs from different GPU / driver / CUDA / torch without --allow-env-mismatch.

A regression needs the threshold crossed in the bad direction AND, for timing metrics, a significant
Mann-Whitney U difference of the per-step times (p < alpha); with fewer than min_samples steps a
side the threshold alone decides and the summary says so. Memory and FID: threshold alone.

policy file (YAML; every key optional, metrics merge over the defaults):
  alpha: 0.01
  min_samples: 5
  fail_on_missing: false
  metrics:                      # percent the metric may move the wrong way; false turns it off
    images_per_s: 5
    peak_mem_allocated_gib: {threshold_pct: 2, min_abs: 0.05}
    step_ms: 10
  overrides:                    # per-cell thresholds, matched on config knobs
    - match: {model: DiT-S/8}
      metrics: {images_per_s: 10}
metrics: images_per_s, images_per_s_per_gpu, steps_per_s, step_ms, tflops_per_s, mfu,
  peak_mem_allocated_gib, peak_mem_reserved_gib, device_mem_gib, cpu_peak_rss_gib, fid, smoke_last_loss
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = POLICY_EXAMPLE
    parser.add_argument("base", metavar="BASE", help="the baseline results.jsonl (or its run directory)")
    parser.add_argument("new", metavar="NEW", help="the new results.jsonl (or its run directory)")
    parser.add_argument(
        "--policy",
        metavar="POLICY.yaml",
        default=None,
        help="thresholds per metric, significance level, per-cell overrides (default: images/s "
        "-5%%, peak allocated memory +2%%, peak reserved memory +5%%, FID +2%%, alpha 0.01)",
    )
    parser.add_argument(
        "--allow-env-mismatch",
        action="store_true",
        help="compare even when GPU, driver, CUDA or torch differ between the runs",
    )
    parser.add_argument(
        "--summary",
        metavar="FILE",
        default=None,
        help="also write the markdown summary to FILE (e.g. for a pull-request comment)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the full comparison as JSON instead of markdown"
    )


def _publish(text: str, summary: str | None) -> None:
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    same = summary and step_summary and Path(summary).resolve() == Path(step_summary).resolve()
    if summary and not same:
        write_atomic(summary, text)
    if step_summary:  # other steps write there too: append, never replace
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(text + "\n")


def run(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    try:
        result = compare_files(args.base, args.new, policy, args.allow_env_mismatch)
    except EnvMismatchError as err:
        _publish(refusal_markdown(args.base, args.new, err), args.summary)
        raise
    text = summary_markdown(result)
    _publish(text, args.summary)
    sys.stdout.write(to_json_text(result) + "\n" if args.json else text)
    return result.exit_code
