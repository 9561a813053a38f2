"""`ditbench compare` against hostile and broken input: every case ends in a correct verdict or a clean
error (exit 2, one paragraph on stderr naming the file, and for a record its line and cell), never
a traceback and never a pass by default."""

from __future__ import annotations

import copy
import json

import pytest
from synthetic_records import CPU_ENV, make_record, write_jsonl

from ditbench.cli import main

MAX_MESSAGE = 2_000  # characters: a refusal is one readable paragraph, however big the input


def cell(img_s=400.0, seed=1, batch_size=8, **kw):
    return make_record("DiT-S/8", "fp32", "none", batch_size, images_per_s=img_s, sample_seed=seed, **kw)


def pair():
    """Two matched cells a side: a comparable, passing gate before each case breaks something."""
    return [cell(), cell(700.0, batch_size=16)], [cell(seed=2), cell(700.0, seed=2, batch_size=16)]


def compare(tmp_path, capsys, monkeypatch, base, new, *args, raw_new: bytes | None = None, policy=None):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, base)
    if raw_new is not None:
        n.write_bytes(raw_new)
    else:
        write_jsonl(n, new)
    extra = list(args)
    if policy is not None:
        p = tmp_path / "gate-policy.yaml"
        p.write_bytes(policy if isinstance(policy, bytes) else policy.encode())
        extra += ["--policy", str(p)]
    code = main(["compare", str(b), str(n), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err, b, n


def assert_clean_error(code, err, *needles):
    assert code == 2, err
    assert err.startswith("ditbench: error: ") and "Traceback" not in err
    assert "\n\n" not in err.strip() and len(err) < MAX_MESSAGE, err
    text = " ".join(err.split())
    for needle in needles:
        assert str(needle) in text, (needle, text)


def raw_lines(records) -> bytes:
    return b"".join((json.dumps(r) + "\n").encode() for r in records)


# ------------------------------------------------------------------------------ records (BASE / NEW)


def _set(path: str, value):
    def change(record):
        node = record
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value

    return change


RECORD_CASES = {
    # name: (change to the NEW record of the first cell, what the message must say)
    "nan images_per_s": (_set("metrics.images_per_s", float("nan")), "metrics.images_per_s is nan"),
    "inf images_per_s": (_set("metrics.images_per_s", float("inf")), "not a finite number"),
    "nan step median": (_set("metrics.step_ms.median", float("nan")), "metrics.step_ms.median"),
    "null step median": (_set("metrics.step_ms.median", None), "metrics.step_ms.median is missing"),
    "ok with metrics null": (_set("metrics", None), "is missing (a status ok record needs it)"),
    "images_per_s a string": (_set("metrics.images_per_s", "400"), "not a number"),
    "images_per_s a bool": (_set("metrics.images_per_s", True), "not a number"),
    "images_per_s negative": (_set("metrics.images_per_s", -400.0), "not a positive value"),
    "images_per_s beyond floats": (_set("metrics.images_per_s", 10**400), "too large"),
    "step sample nan": (_set("metrics.step_ms.samples", [20.0, float("nan"), 20.0]), "samples[1]"),
    "step sample string": (_set("metrics.step_ms.samples", [20.0, "x"]), "samples[1]"),
    "step sample null": (_set("metrics.step_ms.samples", [None, 20.0]), "samples[0] is null"),
    "step sample negative": (_set("metrics.step_ms.samples", [20.0, -1.0]), "samples[1]"),
    "step samples not a list": (_set("metrics.step_ms.samples", "fast"), "not a list"),
    "memory missing on one side": (_set("metrics.peak_mem_allocated_gib", None), "the other run has it"),
    "memory zero": (_set("metrics.peak_mem_allocated_gib", 0.0), "not a positive value"),
    "step_ms not an object": (_set("metrics.step_ms", 20.0), "metrics.step_ms is 20.0, not an object"),
    "noisy not a bool": (_set("metrics.noisy", "yes"), "metrics.noisy is 'yes'"),
    "noise not an object": (
        lambda r: r["metrics"].update(noisy=True, noise=[1]),
        "metrics.noise is [1], not an object",
    ),
}


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
def test_a_value_that_cannot_be_compared_refuses_naming_file_line_and_cell(
    tmp_path, capsys, monkeypatch, case
):
    change, needle = RECORD_CASES[case]
    base, new = pair()
    change(new[0])
    code, out, err, _, n = compare(tmp_path, capsys, monkeypatch, base, new, raw_new=_dump_nan(new))
    assert_clean_error(code, err, needle, f"NEW {n} line 1", new[0]["cell_name"], new[0]["cell_id"])
    assert "no regression" not in out


def _dump_nan(records) -> bytes:
    """JSON lines as a hand edit or another tool might write them: NaN and Infinity allowed."""
    return b"".join((json.dumps(r, allow_nan=True) + "\n").encode() for r in records)


def test_every_cell_nan_refuses_and_names_the_others(tmp_path, capsys, monkeypatch):
    base, new = pair()
    for r in new:
        r["metrics"]["images_per_s"] = float("nan")
        r["metrics"]["step_ms"]["median"] = float("nan")
    code, out, err, _, n = compare(tmp_path, capsys, monkeypatch, base, new, raw_new=_dump_nan(new))
    assert_clean_error(code, err, f"NEW {n} line 1", "4 problems in 2 record(s)", f"NEW {n} line 2")


def test_a_broken_baseline_is_named_as_base(tmp_path, capsys, monkeypatch):
    base, new = pair()
    base[1]["metrics"]["images_per_s"] = float("nan")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    b.write_bytes(_dump_nan(base))
    write_jsonl(n, new)
    code = main(["compare", str(b), str(n)])
    assert_clean_error(code, capsys.readouterr().err, f"BASE {b} line 2", base[1]["cell_name"])


def test_infinity_is_not_an_infinite_improvement(tmp_path, capsys, monkeypatch):
    base, new = pair()
    text = _dump_nan(new).replace(str(new[0]["metrics"]["images_per_s"]).encode(), b"1e999", 1)
    code, out, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new, raw_new=text)
    assert_clean_error(code, err, "metrics.images_per_s is inf")
    assert "improv" not in out


def test_the_writers_nulled_values_refuse_too(tmp_path, capsys, monkeypatch):
    from ditbench.records.jsonl import json_safe

    base, new = pair()
    new[0]["metrics"]["images_per_s"] = float("nan")  # what a cell produced; the writer keeps the record
    new[0] = json_safe(new[0])
    assert new[0]["nonfinite"] == ["metrics.images_per_s"]
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "metrics.images_per_s is missing")


@pytest.mark.parametrize(
    "line, needle",
    [
        (lambda r: dict(r, status="fast"), "status is 'fast', not one of ok"),
        (lambda r: dict(r, status=None), "status is None"),
        (lambda r: dict(r, metrics="fast"), "metrics is 'fast', not an object"),
        (lambda r: dict(r, cell_id=[1, 2]), "cell_id is [1, 2], not a string"),
        (lambda r: dict(r, cell_name=7), "cell_name is 7, not a string"),
        (lambda r: dict(r, env="H200"), "env is 'H200', not an object"),
        (lambda r: "[" * 20_000 + "]" * 20_000, "nested too deeply to read"),
        (lambda r: '{"schema": "ditbench.result/1", "cell_id": ' + "7" * 5000 + "}", "not readable JSON"),
        (lambda r: [r], "is a JSON list"),
    ],
)
def test_a_malformed_record_refuses_naming_file_and_line(tmp_path, capsys, monkeypatch, line, needle):
    base, new = pair()
    first = line(new[0])
    text = (first if isinstance(first, str) else json.dumps(first)).encode() + b"\n" + raw_lines(new[1:])
    code, _, err, _, n = compare(tmp_path, capsys, monkeypatch, base, new, raw_new=text)
    assert_clean_error(code, err, f"{n} line 1", needle)


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "no result records"),
        (b"\n\n  \n", "no result records"),
        (b"\xff\xfe\x00\x01garbage\n", "is not a text file"),
        (b"{not json\n{}\n", "line 1 is not JSON"),
    ],
)
def test_results_files_that_are_not_results(tmp_path, capsys, monkeypatch, content, needle):
    base, new = pair()
    code, _, err, _, n = compare(tmp_path, capsys, monkeypatch, base, new, raw_new=content)
    assert_clean_error(code, err, str(n), needle)


def test_results_paths_that_are_not_files(tmp_path, capsys, monkeypatch):
    base, new = pair()
    empty_dir = tmp_path / "run"
    empty_dir.mkdir()
    code, _, err, b, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert main(["compare", str(b), str(empty_dir)]) == 2
    assert_clean_error(2, capsys.readouterr().err, "directory without a results.jsonl")
    (empty_dir / "results.jsonl").mkdir()  # results.jsonl that is itself a directory
    assert main(["compare", str(b), str(empty_dir)]) == 2
    assert_clean_error(2, capsys.readouterr().err, "results.jsonl")


def test_cells_that_all_stopped_running_fail_and_never_ran_refuses(tmp_path, capsys, monkeypatch):
    base, _ = pair()
    new = [make_record("DiT-S/8", batch_size=b, status="skipped") for b in (8, 16)]
    code, out, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert code == 1 and "### No longer measured (ok before, not run now)" in out and err == ""
    code, out, err, _, _ = compare(tmp_path, capsys, monkeypatch, new, new)
    assert_clean_error(code, err, "no value of any matched cell could be compared", "2 still failing")


def test_a_policy_that_gates_nothing_refuses(tmp_path, capsys, monkeypatch):
    base, new = pair()
    off = "metrics: {images_per_s: false, peak_mem_allocated_gib: false, peak_mem_reserved_gib: false, " + (
        "fid: false, inception_score: false}\n"
    )
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new, policy=off)
    assert_clean_error(code, err, "gated metrics: none")


def test_a_gated_metric_no_cell_measured_refuses(tmp_path, capsys, monkeypatch):
    base = [cell(env=CPU_ENV, device="cpu"), cell(700.0, batch_size=16, env=CPU_ENV, device="cpu")]
    new = [dict(copy.deepcopy(r), run_id="b") for r in base]
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new, policy="metrics: {mfu: 5}\n")
    assert_clean_error(code, err, "gates mfu, but no cell ok in both runs measured it", "allow_incomparable")
    # The defaults gate GPU memory and FID where they are measured: a CPU run compares images/s alone.
    code, out, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert code == 0 and "no regression" in out


def test_allowed_incomparable_values_are_listed_not_compared(tmp_path, capsys, monkeypatch):
    base, new = pair()
    new[0]["metrics"]["images_per_s"] = float("nan")
    new[0]["metrics"]["step_ms"]["samples"][0] = float("nan")
    policy = "allow_incomparable: [images_per_s, step_samples]\n"
    code, out, err, _, _ = compare(
        tmp_path, capsys, monkeypatch, base, new, "--json", raw_new=_dump_nan(new), policy=policy
    )
    assert code == 0, err
    data = json.loads(out)
    first = data["cells"][0]
    assert {m["metric"] for m in first["not_compared"]} == {"images_per_s", "step_samples"}
    assert "images_per_s" not in {d["metric"] for d in first["metrics"]}  # never counted as a pass
    assert data["compared_metrics"] > 0 and data["policy"]["allow_incomparable"] == [
        "images_per_s",
        "step_samples",
    ]


def test_allowing_everything_still_never_passes_on_nothing(tmp_path, capsys, monkeypatch):
    base, new = pair()
    for r in new:
        r["metrics"] = None
    for r in base + new:
        r["env"] = CPU_ENV
    code, _, err, _, _ = compare(
        tmp_path, capsys, monkeypatch, base, new, policy="allow_incomparable: true\n"
    )
    assert_clean_error(code, err, "no value of any matched cell could be compared")


def test_a_base_at_the_smallest_float_gives_no_infinite_percentage(tmp_path, capsys, monkeypatch):
    base, new = pair()
    base[0]["metrics"]["peak_mem_allocated_gib"] = 5e-324
    code, out, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new, "--json")
    assert code == 1, err
    d = next(d for d in json.loads(out)["cells"][0]["metrics"] if d["metric"] == "peak_mem_allocated_gib")
    assert d["change_pct"] is None and d["verdict"] == "regression"  # valid JSON: no Infinity
    code, out, _, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert "from 0" in out


def test_a_refusal_reaches_the_summary_files_and_json(tmp_path, capsys, monkeypatch):
    base, new = pair()
    new[0]["metrics"]["images_per_s"] = float("nan")
    summary = tmp_path / "summary.md"
    code, out, err, _, _ = compare(
        tmp_path, capsys, monkeypatch, base, new, "--json", "--summary", str(summary), raw_new=_dump_nan(new)
    )
    assert_clean_error(code, err, "metrics.images_per_s is nan")
    assert json.loads(out)["result"] == "refused" and json.loads(out)["exit_code"] == 2
    assert "⛔ ditbench compare: refused" in summary.read_text()


# ------------------------------------------------------------------------------------ policy files

POLICY_CASES = {
    "latin-1": ("metrics:\n  images_per_s: 5 # caf\xe9\n".encode("latin-1"), "not UTF-8"),
    "utf-16": ("metrics:\n  images_per_s: 5\n".encode("utf-16"), "UTF-16"),
    "deep": (b"a: " + b"[" * 20_000 + b"]" * 20_000 + b"\n", "nested"),
    "alias bomb": (
        b'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n'
        + b"".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n".encode()
            for i in range(7)
        ),
        "aliases",
    ),
    "duplicate key": (b"alpha: 0.01\nalpha: 0.5\n", "duplicate key"),
    "nan threshold": (b"metrics:\n  images_per_s: .nan\n", "finite number"),
    "inf threshold": (b"metrics:\n  images_per_s: .inf\n", "finite number"),
    "nan alpha": (b"alpha: .nan\n", "`alpha` must be a number between 0 and 1"),
    "huge min_samples": (
        b"min_samples: 1000000000000000000000000000000\n",
        "`min_samples` must be an integer",
    ),
    "long metric name": (b"metrics:\n  " + b"x" * 1000 + b": 5\n", "is not a metric"),
    "huge metric name": (b"metrics:\n  " + b"x" * 20_000 + b": 5\n", "not valid YAML"),
    "match is a list": (
        b"overrides:\n  - match: [1]\n    metrics: {images_per_s: 5}\n",
        "`overrides[0].match` must be a non-empty mapping",
    ),
    "allow a mapping": (b"allow_incomparable: [{images_per_s: 1}]\n", "`allow_incomparable` must be"),
    "top-level list": (b"- images_per_s\n", "must be a YAML mapping"),
    "huge string value": (b"metrics:\n  images_per_s: '" + b"9" * 100_000 + b"'\n", "must be a number"),
}


@pytest.mark.parametrize("case", sorted(POLICY_CASES))
def test_a_hostile_policy_file_is_a_clean_error(tmp_path, capsys, monkeypatch, case):
    content, needle = POLICY_CASES[case]
    base, new = pair()
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new, policy=content)
    assert_clean_error(code, err, "policy", needle)


def test_a_policy_that_is_a_directory_or_missing(tmp_path, capsys, monkeypatch):
    base, new = pair()
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, base)
    write_jsonl(n, new)
    assert main(["compare", str(b), str(n), "--policy", str(tmp_path)]) == 2
    assert_clean_error(2, capsys.readouterr().err, "is a directory")
    assert main(["compare", str(b), str(n), "--policy", str(tmp_path / "nope.yaml")]) == 2
    assert_clean_error(2, capsys.readouterr().err, "does not exist")


def test_summary_targets_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    base, new = pair()
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, base)
    write_jsonl(n, new)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert main(["compare", str(b), str(n), "--summary", str(tmp_path)]) == 2  # a directory
    assert_clean_error(2, capsys.readouterr().err, "--summary", "is a folder")
    assert main(["compare", str(b), str(n), "--summary", str(tmp_path / "pr.json")]) == 2  # not markdown
    assert_clean_error(2, capsys.readouterr().err, "--summary", "ending in .md or .markdown or .txt")
    assert not (tmp_path / "pr.json").exists()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))
    assert main(["compare", str(b), str(n)]) == 2
    assert_clean_error(2, capsys.readouterr().err, "$GITHUB_STEP_SUMMARY", "is a folder")  # before any work


def test_a_run_directory_is_named_by_its_results_file(tmp_path, capsys, monkeypatch):
    base, new = pair()
    new[0]["metrics"]["images_per_s"] = float("nan")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.jsonl").write_bytes(_dump_nan(new))
    b = tmp_path / "base.jsonl"
    write_jsonl(b, base)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert main(["compare", str(b), str(run_dir)]) == 2
    assert_clean_error(2, capsys.readouterr().err, f"NEW {run_dir / 'results.jsonl'} line 1")


# ------------------------------------------------------------------ an output that is an input (issue 21)


def test_a_summary_that_is_the_baseline_is_refused_and_the_baseline_kept(tmp_path, capsys, monkeypatch):
    base, new = pair()
    code, _, err, b, _ = compare(
        tmp_path, capsys, monkeypatch, base, new, "--summary", str(tmp_path / "base.jsonl")
    )
    assert_clean_error(code, err, "--summary", "base.jsonl", "replace")
    assert [json.loads(line)["cell_id"] for line in b.read_text().splitlines()] == [
        r["cell_id"] for r in base
    ]


def test_a_summary_that_is_the_new_runs_results_through_a_link_is_refused(tmp_path, capsys, monkeypatch):
    (tmp_path / "alias.md").symlink_to(tmp_path / "new.jsonl")
    base, new = pair()
    code, _, err, _, n = compare(
        tmp_path, capsys, monkeypatch, base, new, "--summary", str(tmp_path / "alias.md")
    )
    assert_clean_error(code, err, "--summary", "new.jsonl")
    assert len(n.read_text().splitlines()) == 2


def test_a_summary_that_is_a_hard_link_of_the_policy_is_refused(tmp_path, capsys, monkeypatch):
    base, new = pair()
    (tmp_path / "gate-policy.yaml").write_text("alpha: 0.01\n")
    import os

    os.link(tmp_path / "gate-policy.yaml", tmp_path / "pr-comment.md")
    code, _, err, _, _ = compare(
        tmp_path,
        capsys,
        monkeypatch,
        base,
        new,
        "--summary",
        str(tmp_path / "pr-comment.md"),
        policy="alpha: 0.01\n",
    )
    assert_clean_error(code, err, "--summary", "--policy")
    assert (tmp_path / "gate-policy.yaml").read_text() == "alpha: 0.01\n"


def test_a_step_summary_that_is_the_baseline_is_refused(tmp_path, capsys, monkeypatch):
    base, new = pair()
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, base)
    write_jsonl(n, new)
    before = b.read_bytes()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(b))
    code = main(["compare", str(b), str(n)])
    assert_clean_error(code, capsys.readouterr().err, "$GITHUB_STEP_SUMMARY", "BASE")
    assert b.read_bytes() == before


def test_a_step_summary_that_is_a_fifo_is_refused_at_once(tmp_path, capsys, monkeypatch):
    import os

    base, new = pair()
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, base)
    write_jsonl(n, new)
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "fifo"))
    code = main(["compare", str(b), str(n)])  # opening a FIFO nobody reads would block forever
    assert_clean_error(code, capsys.readouterr().err, "$GITHUB_STEP_SUMMARY", "FIFO")


def test_a_step_summary_that_is_dev_null_is_accepted(tmp_path, capsys, monkeypatch):
    base, new = pair()
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, base)
    write_jsonl(n, new)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", "/dev/null")
    assert main(["compare", str(b), str(n)]) == 0


# ------------------------------------------------------------- a record that contradicts itself (issue 21)


def test_a_halved_rate_with_unchanged_samples_is_refused_not_passed(tmp_path, capsys, monkeypatch):
    base, new = pair()
    new[0]["metrics"]["images_per_s"] /= 2  # the forge: the samples still say the old speed
    new[0]["metrics"]["steps_per_s"] /= 2
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "new.jsonl line 1", "metrics.images_per_s", "per-step samples")


def test_a_rate_that_disagrees_with_steps_per_s_is_refused(tmp_path, capsys, monkeypatch):
    base, new = pair()
    new[1]["metrics"]["images_per_s"] *= 1.5
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "new.jsonl line 2", "metrics.images_per_s", "steps_per_s")


def test_records_dated_in_the_future_cannot_shadow_the_real_ones(tmp_path, capsys, monkeypatch):
    base, new = pair()
    slow = [cell(130.0, seed=2), cell(230.0, seed=2, batch_size=16)]  # 3x slower: a real regression
    forged = copy.deepcopy(base)
    for r in forged:
        r["started_at"] = "2999-01-01T00:00:00Z"
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, forged + slow)
    assert_clean_error(code, err, "new.jsonl line 1", "started_at", "2999-01-01", "in the future")


def test_within_a_file_the_last_record_of_a_cell_wins_as_in_the_runner(tmp_path, capsys, monkeypatch):
    base, _ = pair()
    early = copy.deepcopy(base)  # fast copies, dated later than the real records after them
    for r in early:
        r["started_at"] = "2026-11-29T13:00:00Z"
    slow = [cell(130.0, seed=2), cell(230.0, seed=2, batch_size=16)]
    code, out, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, early + slow)
    assert code == 1, err  # the slow records, appended last, are the run's latest: a regression


def test_a_record_keeping_another_cells_id_with_another_config_is_refused(tmp_path, capsys, monkeypatch):
    base, new = pair()
    new[0]["config"].update(batch_size=4, global_batch=4)  # a valid config, but keeps BASE's cell_id
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "new.jsonl line 1", "cell_id", "not the id of the record's config")


def test_a_record_whose_config_changed_model_under_the_same_id_is_refused(tmp_path, capsys, monkeypatch):
    base, new = pair()
    new[1]["config"]["model"] = "DiT-XL/2"
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "new.jsonl line 2", "cell_id")


@pytest.mark.parametrize(
    "change, field, needle",
    [
        ({"gpu_memory_gb": 24}, "config.gpu_memory_gb", "unknown key `gpu_memory_gb`"),
        ({"batch_size": 0}, "config.batch_size", "batch_size must be an integer from 1"),
        ({"global_batch": 99}, "config.global_batch", "is not batch_size x gpus x nodes x grad_accum"),
    ],
)
def test_a_config_that_is_not_a_cells_is_refused(tmp_path, capsys, monkeypatch, change, field, needle):
    base, new = pair()
    new[0]["config"].update(change)
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "new.jsonl line 1", f"field {field}", needle)


def test_a_config_missing_a_key_is_refused(tmp_path, capsys, monkeypatch):
    base, new = pair()
    del new[1]["config"]["card"]
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "new.jsonl line 2", "field config:", "missing card")


# ------------------------------------------------------------- numbers pandas cannot hold (issue 21)

HOLDABLE_CASES = {
    "an integer >= 2**63 in config": (_set("config.seed", 2**63), "config.seed", "64-bit"),
    "an integer >= 2**63 in env": (_set("env.cpu_count", 2**70), "env.cpu_count", "64-bit"),
    "a list where a knob's text belongs": (
        _set("config.precision", ["fp32", "bf16"]),
        "field config.precision",
        "valid: fp32, tf32, fp16, bf16",
    ),
    "an object where a knob's text belongs": (
        _set("config.attention", {"a": 1}),
        "field config.attention",
        "valid: math, sdpa",
    ),
}


@pytest.mark.parametrize("case", sorted(HOLDABLE_CASES))
def test_a_value_pandas_cannot_hold_is_an_input_error(tmp_path, capsys, monkeypatch, case):
    edit, *needles = HOLDABLE_CASES[case]
    base, new = pair()
    edit(new[0])
    # checked before the id: only the value is named
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "new.jsonl line 1", *needles)


def test_a_config_this_ditbench_cannot_read_back_is_named_as_such(tmp_path, capsys, monkeypatch):
    base, new = pair()
    new[0]["config"]["knob_of_a_newer_version"] = 1  # not a knob of this version: no id can be checked
    code, _, err, _, _ = compare(tmp_path, capsys, monkeypatch, base, new)
    assert_clean_error(code, err, "new.jsonl line 1", "config.knob_of_a_newer_version", "unknown key")
