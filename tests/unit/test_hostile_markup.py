"""Issue 34, classes 4 and 8: a record's text is inert in every markdown and HTML file ditbench writes,
and text that is not valid Unicode never crashes a command.

env.gpu_name, env.cpu, labels, cell names, reasons and run ids holding backticks, pipes, newlines,
links, images and HTML reach compare's summary (stdout, --summary, $GITHUB_STEP_SUMMARY, its refusal),
report.md / report.html, a run's summary.md and TensorBoard's text: none of them adds a link, an
image, HTML, a table row or a heading. A lone surrogate (JSON's "\\ud800") in any of those fields is
written escaped: compare, report and export end with their usual exit status, never a
UnicodeEncodeError (exit 1 reads as a regression); an input that still cannot be encoded is exit 2.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from synthetic_records import make_record, write_jsonl

from ditbench.cli import main
from ditbench.core.escape import md_code, md_inline, md_text

PAYLOAD = (
    "x` | ![img](http://evil/i.png) [link](http://evil) <img src=x onerror=alert(1)> <b>b</b>"
    "\n| forged | row |\n# head"
)
SURROGATE = "lone \ud800 \udfff"


def hostile(text: str, **kw) -> dict:
    record = make_record(**kw)
    record["cell_name"] = f"cell {text}"
    record["label"] = f"label {text}"
    record["env"] = dict(record["env"], gpu_name=f"H200 {text}", cpu=f"cpu {text}", torch=f"2.14 {text}")
    return record


def assert_inert(markdown: str) -> None:
    """No HTML, image, link, heading or table row that the payload brought in (code spans show their
    text as it is)."""
    text = re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", markdown)  # what is not inside a code span
    assert "<img" not in text and "<b>" not in text
    assert not re.search(r"(?<!\\)\[[^\]]*\]\(http://evil", text)  # a link or image needs an unescaped [
    lines = markdown.splitlines()
    assert not any(line.startswith(("| forged", "# head", "\\# head")) for line in lines)
    for i, line in enumerate(lines):  # every row of a table has its header's number of cells
        if line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|(-+:?\|)+", lines[i + 1]):
            width = len(re.findall(r"(?<!\\)\|", line))
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                assert len(re.findall(r"(?<!\\)\|", lines[j])) == width, lines[j]
                j += 1


def test_the_escapes_hold_for_each_context():
    assert md_text("a|b`c*d_e [x](y) <b>\n# h") == r"a\|b\`c\*d_e \[x](y) &lt;b> # h"
    assert md_text("# title") == r"\# title" and md_text("- item") == r"\- item"
    assert md_code("a`b|c") == "``a`b\\|c``" and md_code("`x") == "`` `x ``"
    assert md_inline("**held** by `a|b` and [l](u) <i>") == r"**held** by `a\|b` and \[l](u) &lt;i>"
    assert md_text(SURROGATE) == r"lone \\ud800 \\udfff"


@pytest.mark.parametrize("env_differs", [False, True])
def test_compare_summary_stdout_and_step_summary_are_inert(env_differs, tmp_path, capsys, monkeypatch):
    base = [make_record(sample_seed=1)]
    new = [hostile(PAYLOAD, sample_seed=2)]
    if not env_differs:
        base = [hostile(PAYLOAD, sample_seed=1)]
    write_jsonl(tmp_path / "b.jsonl", base)
    write_jsonl(tmp_path / "n.jsonl", new)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "step.md"))
    code = main(
        ["compare", str(tmp_path / "b.jsonl"), str(tmp_path / "n.jsonl"), "--summary", str(tmp_path / "s.md")]
    )
    assert code == (2 if env_differs else 0)  # environments differ: the refusal is written there too
    out = capsys.readouterr().out
    for text in (out, (tmp_path / "s.md").read_text(), (tmp_path / "step.md").read_text()):
        if text:
            assert_inert(text)
    assert "ditbench compare" in (tmp_path / "step.md").read_text()


def test_report_md_and_html_are_inert(tmp_path):
    records = [hostile(PAYLOAD), hostile(PAYLOAD, batch_size=16, status="oom", reason=f"reason {PAYLOAD}")]
    write_jsonl(tmp_path / "r.jsonl", records)
    assert main(["report", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o")]) == 0
    assert_inert((tmp_path / "o" / "report.md").read_text())
    html = (tmp_path / "o" / "report.html").read_text()
    assert "<img src=x" not in html and "&lt;img src=x" in html and 'href="http://evil' not in html


def test_a_runs_summary_md_is_inert(tmp_path):
    from ditbench.bench.summary import write_summary

    suite = SimpleNamespace(name=f"s {PAYLOAD}", description=PAYLOAD, overrides={"lr": PAYLOAD})
    record = hostile(PAYLOAD, status="error", reason=PAYLOAD)
    write_summary(tmp_path / "summary.md", suite, [record, hostile(PAYLOAD, batch_size=16)])
    assert_inert((tmp_path / "summary.md").read_text())


def test_tensorboards_record_text_is_inert():
    from ditbench.export.runs import tracker_run
    from ditbench.export.trackers import _identity
    from ditbench.records.model import Record

    assert_inert(_identity(tracker_run(Record.model_validate(hostile(PAYLOAD)), "/x/r.jsonl:1")))


# ------------------------------------------------------------------------- text that is not text


def test_compare_report_and_export_write_a_lone_surrogate_escaped(tmp_path, capsys, monkeypatch):
    records = [hostile(SURROGATE, run_id=f"run {SURROGATE}"), hostile(SURROGATE, batch_size=16)]
    records[1]["status"], records[1]["reason"], records[1]["metrics"] = "error", f"boom {SURROGATE}", None
    write_jsonl(tmp_path / "r.jsonl", records)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "step.md"))
    r = str(tmp_path / "r.jsonl")
    assert main(["compare", r, r, "--summary", str(tmp_path / "s.md")]) in (0, 3)
    assert main(["compare", r, r, "--json"]) in (0, 3)
    assert main(["report", r, "--out", str(tmp_path / "o"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "\\ud800" in out
    for path in (
        tmp_path / "s.md",
        tmp_path / "step.md",
        tmp_path / "o" / "report.md",
        tmp_path / "o" / "results.csv",
    ):
        assert "\\ud800" in path.read_text(encoding="utf-8"), path


def test_export_to_tensorboard_takes_a_lone_surrogate(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    write_jsonl(tmp_path / "r.jsonl", [hostile(SURROGATE, run_id=f"run {SURROGATE}")])
    assert (
        main(["export", str(tmp_path / "r.jsonl"), "--to", "tensorboard", str(tmp_path / "tb"), "--json"])
        == 0
    )
    assert "Traceback" not in capsys.readouterr().err


def test_a_unicode_error_from_an_input_is_exit_2_never_1(monkeypatch, capsys):
    import ditbench.cli.compare as gate_cli

    def fail(args):
        "\ud800".encode("utf-8")

    monkeypatch.setattr(gate_cli, "run", fail)
    assert main(["compare", "a", "b"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("ditbench: error: an input holds text that is not valid Unicode")
        and "Traceback" not in err
    )
