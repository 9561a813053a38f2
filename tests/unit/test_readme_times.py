"""The docs' figures about ditbench itself are the measured ones: each marked span of README.md and
docs/*.md is exactly what benchmarks/readme_times.py renders from reports/readme_times/times.json, so
a figure is neither edited by hand nor left behind when it is re-measured."""

from __future__ import annotations

import json

from benchmark_scripts import load_benchmark


def _script():
    return load_benchmark("readme_times")


def test_every_marked_figure_in_the_docs_is_the_measured_one():
    rt = _script()
    times = json.loads(rt.TIMES.read_text())
    marks = [(doc.name, m) for doc in rt.documents() for m in rt.MARKER.finditer(doc.read_text())]
    assert {m["key"] for _, m in marks} == set(times), "every measurement is shown, every span measured"
    for name, m in marks:
        assert m["text"] == rt.render(m["key"], times[m["key"]], m["form"]), (name, m["key"], m["form"])
    for key, entry in times.items():
        for condition in ("cores", "date"):
            assert condition in entry, (key, condition)


def test_the_docs_state_no_figure_about_ditbench_outside_a_span():
    """Test counts and the time of a suite or of the test loop appear only inside measured spans."""
    import re

    rt = _script()
    said = re.compile(
        r"\d[\d,]* tests\b|\b(cpu_smoke|cpu_multi|cpu_quality|dit_resource_guide_cpu|quick loop)\b"
        r"[^.\n]{0,40}?\b\d[\d.,]*\s*(s|min|minutes|seconds)\b"
    )
    loose = [
        f"{doc.name}: {m[0]}"
        for doc in rt.documents()
        for m in said.finditer(rt.MARKER.sub("", doc.read_text()))
    ]
    assert loose == []


def test_the_figures_are_read_from_what_the_commands_print():
    rt = _script()
    m = rt.DONE_LINE.search("done: 50 steps in 1.6 s, 30.41 steps/s, 243.3 img/s (includes ...)")
    assert (m["steps"], m["s"]) == ("50", "1.6")
    log = "...\n= 1,435 passed, 11 skipped, 3 warnings in 887.12s (0:14:47) =\n"
    entry = rt.from_pytest_log(log)
    assert (entry["passed"], entry["skipped"], entry["wall_s"]) == (1435, 11, 887)
    entry = rt.from_pytest_log("= 12 passed in 3.50s =")
    assert (entry["passed"], entry["skipped"], entry["wall_s"]) == (12, 0, 4)
    quick = rt.pytest_counts("2142 passed, 11 skipped, 250 deselected, 2 warnings in 170.31s (0:02:50)")
    assert quick == {"failed": 0, "passed": 2142, "skipped": 11, "deselected": 250, "pytest_s": 170}
    failing = rt.pytest_counts("2 failed, 2381 passed, 16 skipped, 124 deselected, 39 warnings in 797.77s")
    assert (failing["failed"], failing["passed"], failing["pytest_s"]) == (2, 2381, 798)


def test_each_entry_renders_its_figure_and_a_short_form():
    rt = _script()
    base = {"cores": 2, "omp_num_threads": "1", "load_average_1min": 2.5, "other_cpu_share": 0.2}
    base["date"] = "2026-12-04"
    conditions = (
        "2 CPU cores, OMP_NUM_THREADS=1, load average 2.5, other processes 20% of the cores; 2026-12-04"
    )
    assert rt.render("cpu_multi", {**base, "wall_s": 74.2}) == f"74 s measured on {conditions}"
    assert rt.render("cpu_multi", {**base, "wall_s": 74.2}, "short") == "74 s"
    assert rt.render("dit_resource_guide_cpu", {**base, "wall_s": 228.0}, "short") == "3.8 min"
    quick = {**base, "wall_s": 301.0, "passed": 2142, "skipped": 11, "deselected": 250}
    assert rt.render("pytest_quick", quick) == (
        f"2,142 tests passed (11 skipped, 250 slow ones deselected) in 5.0 min on {conditions}"
    )
    assert rt.render("pytest_quick", quick, "short") == "2,142 tests in 5.0 min"
    assert rt.render("pytest_quick", {**quick, "failed": 2}).startswith(
        "2,142 tests passed (2 FAILED, 11 skipped, 250 slow ones deselected) in 5.0 min"
    )


def test_rewriting_replaces_only_the_marked_spans(tmp_path):
    rt = _script()
    readme = tmp_path / "README.md"
    readme.write_text(
        "a <!-- measured:cpu_smoke -->old<!-- /measured --> b <!-- measured:nope -->x<!-- /measured -->\n"
    )
    entry = {
        "wall_s": 384.0,
        "cores": 2,
        "omp_num_threads": "1",
        "load_average_1min": 1.5,
        "other_cpu_share": 0.1,
        "date": "2026-12-01",
    }
    readme.write_text(readme.read_text() + "short: <!-- measured:cpu_smoke.short -->x<!-- /measured -->\n")
    missing = rt.rewrite_readme({"cpu_smoke": entry}, readme)
    assert missing == ["nope"]
    assert "short: <!-- measured:cpu_smoke.short -->6.4 min<!-- /measured -->" in readme.read_text()
    text = readme.read_text()
    assert text.startswith(
        "a <!-- measured:cpu_smoke -->6.4 min measured on 2 CPU cores, OMP_NUM_THREADS=1, "
    )
    assert "load average 1.5, other processes 10% of the cores; 2026-12-01<!-- /measured --> b " in text


def test_a_pinned_run_says_so_and_the_quality_figure_carries_its_cpu_time():
    entry = {
        "wall_s": 1500.4,
        "cpu_s": 430.2,
        "cores": 2,
        "cores_allowed": 1,
        "omp_num_threads": "1",
        "load_average_1min": 9.0,
        "other_cpu_share": 0.7,
        "date": "2026-12-01",
        "fid": [{"step": 0, "fid": 900.0, "spread": 5.0}, {"step": 1500, "fid": 60.5, "spread": 3.2}],
    }
    assert _script().render("cpu_quality", entry) == (
        "1500 s for the whole suite (430 s of CPU time in its processes) on 2 CPU cores (the run pinned "
        "to 1), OMP_NUM_THREADS=1, load average 9, other processes 70% of the cores; 2026-12-01; FID "
        "(test Inception, mean ± spread over the sample seeds) 900.0 ± 5.0 at step 0, 60.5 ± 3.2 at step "
        "1,500"
    )
