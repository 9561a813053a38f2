"""The README and docs/ against the code they describe: sizes, links, paths, commands, the code map and
the generated tables, so that what a user reads cannot drift from what ditbench does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from benchmark_scripts import load_benchmark
from cli_commands import ditbench_commands, parse_error

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ditbench"
README = ROOT / "README.md"
CHANGELOG = ROOT / "CHANGELOG.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
TOP = ("ditbench/", "docs/", "benchmarks/", "tests/", "reports/", "baselines/", "examples/", "suites/")
TOP += ("claims/", ".ci/", ".github/")


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def test_the_readme_and_the_changelog_stay_short():
    assert len(README.read_text().splitlines()) <= 300
    assert len(CHANGELOG.read_text().splitlines()) <= 150


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces as dashes."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for m in re.finditer(r"^#{1,6} (.+)$", _prose(path.read_text()), re.M):
        slug = _slug(m[1])
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_link_reaches_a_file_and_its_heading():
    broken = []
    for doc in DOCS:
        for m in LINK.finditer(_prose(doc.read_text())):
            target = m["target"]
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert broken == []


def test_the_slugs_are_githubs():
    assert _slug("Trying `--executor slurm` on one machine") == "trying---executor-slurm-on-one-machine"
    assert _slug("Sample quality: `ditbench fid`") == "sample-quality-ditbench-fid"


def test_every_path_the_docs_name_exists():
    """A file or folder of the repository named in backticks (`ditbench/spec/knobs.py`) exists: a module
    that moved takes its mentions with it. Names with placeholders (`<out>`, NAME, *) are patterns."""
    missing = []
    for doc in DOCS:
        for token in re.findall(r"`([^`\s]+)`", _prose(doc.read_text())):
            path = token.split("::")[0].rstrip(".,:;)")
            if path.startswith(TOP) and not re.search(r"[<>*{}\[\]]|NAME|\.\.\.|\$", path):
                if not (ROOT / path).exists():
                    missing.append(f"{doc.name}: {path}")
    assert missing == []


def _code_map() -> list[str]:
    """The paths the architecture page's code map names (the first word of each unindented line of its
    fenced blocks, relative to ditbench/)."""
    text = ARCHITECTURE.read_text().split("## Code map", 1)[1]
    return [
        line.split()[0]
        for m in FENCE.finditer(text)
        for line in m["body"].splitlines()
        if line.strip() and not line[0].isspace()
    ]


def _package_paths() -> set[str]:
    """Every module (but __init__.py) and every package folder of ditbench/, as the code map writes them."""
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    packages = {
        f"{p.parent.relative_to(PACKAGE)}/" for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE
    }
    return modules | packages


def test_the_code_map_names_every_module_and_only_what_exists():
    named = _code_map()
    assert len(named) == len(set(named)), sorted({p for p in named if named.count(p) > 1})
    missing = sorted(_package_paths() - set(named))
    assert missing == [], f"docs/architecture.md's code map lacks {missing}"
    stale = sorted(p for p in named if not (PACKAGE / p).exists())
    assert stale == [], f"docs/architecture.md's code map names what is not there: {stale}"


def _command_blocks() -> list[tuple[str, str]]:
    return [
        (doc.name, m["body"])
        for doc in DOCS
        for m in FENCE.finditer(doc.read_text())
        if m["info"].strip() in ("bash", "sh", "shell", "console")
    ]


def test_every_ditbench_command_the_docs_show_parses():
    """Each `ditbench ...` in a README or docs/ shell block is accepted by today's CLI."""
    found = [(name, argv) for name, body in _command_blocks() for argv in ditbench_commands([body])]
    shown = {argv[0] for _, argv in found if argv}
    assert shown >= {"run", "suites", "report", "compare", "ab", "plan", "fid", "sample", "train", "export"}
    refused = [(name, argv, parse_error(argv)) for name, argv in found if parse_error(argv)]
    assert refused == []


def test_the_command_finder_reads_shell_lines():
    block = (
        "OMP_NUM_THREADS=1 ditbench run cpu_smoke --out runs/x   # a comment\n"
        "envs/main/bin/ditbench ab ci_gate \\\n  --a envs/main && ditbench env --json\n"
        "torchrun --standalone --nproc-per-node 8 -m ditbench sample ckpt.pt --out s.npz\n"
        "pip install ditbench\n"
        "ditbench suites --schema > suite.schema.json 2>&1\n"
    )
    assert ditbench_commands([block]) == [
        ["run", "cpu_smoke", "--out", "runs/x"],
        ["ab", "ci_gate", "--a", "envs/main"],
        ["env", "--json"],
        ["sample", "ckpt.pt", "--out", "s.npz"],
        ["suites", "--schema"],
    ]
    assert parse_error(["run", "cpu_smoke", "--no-such-flag"]) is not None
    assert parse_error(["run", "cpu_smoke", "batch_size=8"]) is None
    assert parse_error(["nosuch"]) is not None


def test_the_generated_tables_are_the_models():
    """docs/'s knob and suite-key tables are what benchmarks/docs_tables.py makes from the pydantic
    models: rerun it after changing a knob."""
    tables = load_benchmark("docs_tables")
    generated = tables.tables()
    marked = {}
    for doc in DOCS:
        for m in tables.MARKER.finditer(doc.read_text()):
            marked[m["name"]] = m["body"]
    assert set(marked) == set(generated)
    for name, body in marked.items():
        assert body == generated[name], f"{name}: run `python benchmarks/docs_tables.py`"


def test_the_tables_notes_name_real_fields_and_every_row_says_what_it_sets():
    tables = load_benchmark("docs_tables")
    fields = set()
    from ditbench.spec.cell import Steps
    from ditbench.spec.cluster import ClusterOptions
    from ditbench.spec.quality import Sampler
    from ditbench.spec.suite import Defaults, PlanOption, QualitySection, Smoke, SuiteFile

    for model in (Steps, ClusterOptions, Sampler, Defaults, PlanOption, QualitySection, Smoke, SuiteFile):
        fields |= {f"{model.__name__}.{k}" for k in model.model_fields}
    assert set(tables.NOTES) <= fields
    empty = [row for t in tables.tables().values() for row in t.splitlines()[2:] if row.endswith("|  |")]
    assert empty == []


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "integer", "minimum": 1, "maximum": 4096}, "integer 1 to 4,096"),
        (
            {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"type": "null"}]},
            "number in (0, 1]",
        ),
        ({"enum": ["DiT-XL/2", "DiT-XL-2", "DiT-S/8"]}, "DiT-XL/2, DiT-S/8"),
        ({"type": "array", "items": {"$ref": "#/$defs/PartialKnobs"}}, "a list of partial cells"),
        (
            {"anyOf": [{"type": "boolean"}, {"type": "string", "pattern": "^every_\\d$"}]},
            "true, false or text matching `^every_\\d$`",
        ),  # noqa: E501
        ({"type": "string", "pattern": "^[-+]?(\\d+)[eE]\\d+$"}, None),
    ],
)
def test_a_fields_schema_in_words(schema, words):
    assert load_benchmark("docs_tables")._valid(schema) == words


def test_no_suite_states_its_own_duration():
    """How long a suite takes is a measured figure of docs/ (reports/readme_times/times.json), not
    words in its description, which `ditbench suites` prints and nobody re-measures."""
    from ditbench.spec.suite import shipped_suites

    duration = re.compile(r"\b\d[\d.,]*\s*(s|sec|seconds?|min|minutes?|h|hours?)\b", re.I)
    said = {}
    for name, path in shipped_suites().items():
        description = yaml.safe_load(path.read_text()).get("description") or ""
        if duration.search(description):
            said[name] = duration.search(description)[0]
    assert said == {}


def test_the_worked_result_quotes_the_committed_report():
    """Every images/s figure the README quotes is in the committed report it shows."""
    report = (ROOT / "reports" / "cpu_smoke" / "report.md").read_text()
    quoted = re.findall(r"(\d[\d,]*\.\d) img/s", README.read_text())
    assert quoted, "the README's worked result quotes no figure"
    assert [q for q in quoted if f"| {q} |" not in report and f"{q} img/s" not in report] == []
