"""The package's shape: no import cycle (lazy imports included), modules of one concept and
bounded size, sampling independent of training, one version."""

import ast
from pathlib import Path

import pytest

import ditbench

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ditbench"
MAX_LINES = 450


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """module -> the ditbench modules it imports anywhere in its body (top level, in functions, lazily).

    `from ditbench.x import y` counts as importing ditbench.x.y when that is a module, else ditbench.x.
    The implicit import of a parent package's __init__ is not an edge: Python finishes it first.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] != "ditbench":
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in modules else node.module)
        graph[name] = edges - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_lazy_or_not():
    assert _cycles(import_graph()) == []


def test_no_import_cycle_among_the_benchmark_scripts():
    """benchmarks/ scripts import each other by bare name (they run with their folder on sys.path)."""
    scripts = {p.stem: p for p in (ROOT / "benchmarks").glob("*.py")}
    graph = {}
    for name, path in scripts.items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        graph[name] = (names & scripts.keys()) - {name}
    assert graph.get("device_report") is not None and _cycles(graph) == []


# The layers, bottom first: each is one or more folders (a module belongs to its deepest listed folder).
# A module may import its own layer and those below, never one above (lazy imports included); the
# package `ditbench` itself (its __version__ and the lazy `load_results`) is imported from anywhere.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors, units, plain text, progress, faults", ("ditbench.core",)),
    ("files in and out", ("ditbench.files",)),
    ("the machine: devices, precisions, cards, process groups", ("ditbench.hardware",)),
    ("the network, the diffusion, the VAE and its stand-ins", ("ditbench.models",)),
    ("the typed spec: knobs, cells, suites", ("ditbench.spec",)),
    ("sample quality metrics", ("ditbench.metrics",)),
    ("the result record and its metric table", ("ditbench.records",)),
    ("one process: train, sample, score while training", ("ditbench.train", "ditbench.sampling",
                                                           "ditbench.quality")),
    ("the memory and speed planner", ("ditbench.plan",)),
    ("one cell's process: the core, the window, the meters", ("ditbench.bench.cell",)),
    ("how a cell's processes start", ("ditbench.bench.launch",)),
    ("the suite loop and its executors", ("ditbench.bench",)),
    ("reading records back: reports, claims", ("ditbench.report",)),
    ("the regression gate (`compare`)", ("ditbench.report.gate",)),
    ("the paired A/B gate; trackers", ("ditbench.ab", "ditbench.export")),
    ("the entry point and one module per command", ("ditbench.cli", "ditbench.__main__")),
]  # fmt: skip
MAX_LAYER_MODULES = 15


def _layer_of(module: str) -> int:
    """The layer whose folder holds the module most closely (its deepest listed folder)."""
    best, found = "", None
    for i, (_, folders) in enumerate(LAYERS):
        for folder in folders:
            if (module == folder or module.startswith(folder + ".")) and len(folder) > len(best):
                best, found = folder, i
    assert found is not None, f"{module} is in no layer's folder: add its folder to LAYERS"
    return found


def test_every_module_lives_in_a_layer_folder():
    """The folders show the layers: nothing but the package itself lies loose in ditbench/."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert loose == [], loose
    for module in _modules():
        if module != "ditbench":
            _layer_of(module)


def test_each_layer_holds_at_most_fifteen_modules():
    sizes: dict[str, list[str]] = {name: [] for name, _ in LAYERS}
    for module in _modules():
        if module != "ditbench":
            sizes[LAYERS[_layer_of(module)][0]].append(module)
    big = {name: len(modules) for name, modules in sizes.items() if len(modules) > MAX_LAYER_MODULES}
    assert big == {}, big


def test_imports_only_point_down():
    graph = import_graph()
    up = sorted(
        f"{m} -> {e}"
        for m, edges in graph.items()
        if m != "ditbench"
        for e in edges
        if e != "ditbench" and _layer_of(e) > _layer_of(m)
    )
    assert up == [], up


def test_no_module_imports_another_modules_private_names():
    """What a module starts with `_` is its own: e.g. bench/jobs.py takes from bench/runner.py only the
    runner's public functions (the launchers meet through launch/base.py's interface)."""
    private = sorted(
        f"{path.relative_to(ROOT)}: {node.module}.{alias.name}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ditbench")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    )
    assert private == [], private


def test_no_module_patches_with_unittest_mock():
    """Seams, not patches: production code never monkeypatches (the planner uses the Trainer's seams)."""
    patching = sorted(
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("unittest"))
        or (isinstance(node, ast.Import) and any(a.name.startswith("unittest") for a in node.names))
    )
    assert patching == [], patching


def test_sampling_never_imports_training():
    graph = import_graph()
    seen, todo = set(), [m for m in graph if m.startswith("ditbench.sampling")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    assert not {m for m in seen if m.startswith("ditbench.train")}, sorted(seen)


def test_no_module_is_over_the_size_bound():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_the_version_has_one_source():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ditbench.__version__"}
    assert ditbench.__version__.count(".") == 2


def test_no_dead_code():
    """vulture finds no unused code it is sure of (80%: unused imports, variables, unreachable code)."""
    pytest.importorskip("vulture")
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "vulture", str(PACKAGE), "--min-confidence", "80"],
        capture_output=True,
        text=True,
    )
    assert done.stdout == "" and done.returncode == 0, done.stdout + done.stderr
