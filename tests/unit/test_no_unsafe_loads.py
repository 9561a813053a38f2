"""No code path in ditbench may unpickle a file: every loader call in the package source is checked.

The scan parses each module (so calls split over lines, `import numpy as np` and
`from torch import load` are all seen) and fails on:
- `torch.load` without `weights_only=True`; `numpy.load` without `allow_pickle=False`;
- `yaml.load`/`load_all` without a safe loader, `yaml.unsafe_load`/`full_load`;
- any pickle-family loader (`pickle`, `_pickle`, `dill`, `cloudpickle`, `joblib`, `shelve`,
  `marshal`, `pandas.read_pickle`, `torch.jit.load`, `torch.package`);
and, in the text, on `weights_only=False` and `allow_pickle=True` wherever they appear.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ditbench"

# Calls with a known-safe reason, matched by (enclosing function, call text) so an exception
# survives its file being moved or renamed but covers nothing else. Each says why it cannot unpickle.
KNOWN_SAFE_CALLS = {
    # numpy >= 1.16.3 defaults to allow_pickle=False (an object array raises ValueError), and these
    # read npz files of plain arrays. Reported to the lead: the owners should spell out
    # allow_pickle=False so the rule holds without this list.
    ("merge_shards", "np.load(shard_path(shard_dir, k))"),  # sampling: its own shards
    ("extract_latents", 'np.load(parts / f"shard_{s:06d}.npz")'),  # cli/extract_latents.py: its own shards
}

TEXT_RULES = {
    r"weights_only\s*=\s*False": "torch.load(weights_only=False) unpickles arbitrary objects",
    r"allow_pickle\s*=\s*True": "allow_pickle=True unpickles object arrays",
}
FORBIDDEN = {
    "pickle.load": "unpickles",
    "pickle.loads": "unpickles",
    "pickle.Unpickler": "unpickles",
    "_pickle.load": "unpickles",
    "_pickle.loads": "unpickles",
    "_pickle.Unpickler": "unpickles",
    "dill.load": "unpickles",
    "dill.loads": "unpickles",
    "cloudpickle.load": "unpickles",
    "cloudpickle.loads": "unpickles",
    "joblib.load": "unpickles",
    "shelve.open": "unpickles",
    "marshal.load": "loads code objects",
    "marshal.loads": "loads code objects",
    "pandas.read_pickle": "unpickles",
    "torch.jit.load": "runs TorchScript from a file",
    "torch.package.PackageImporter": "unpickles",
    "yaml.unsafe_load": "constructs arbitrary Python objects",
    "yaml.unsafe_load_all": "constructs arbitrary Python objects",
    "yaml.full_load": "constructs Python objects",
    "yaml.full_load_all": "constructs Python objects",
}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
CHECKED = {*FORBIDDEN, "torch.load", "numpy.load", "yaml.load", "yaml.load_all"}


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted origin, from every import in the module (at any depth)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
                else:
                    names[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`np.load` -> 'numpy.load' (through the module's imports); None for calls on expressions."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _enclosing_functions(tree: ast.AST) -> dict[ast.AST, str]:
    owner = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                owner[node] = fn.name  # inner functions come later in the walk and win
    return owner


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _is_const(node, value) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def problems_in_source(source: str, filename: str = "<string>") -> list[str]:
    """Every unsafe loader use in one module's source, as 'line N: what'."""
    found = []
    for pattern, why in TEXT_RULES.items():
        for m in re.finditer(pattern, source):
            found.append(f"line {source.count(chr(10), 0, m.start()) + 1}: `{m.group(0)}`: {why}")
    tree = ast.parse(source, filename)
    aliases, owner = _aliases(tree), _enclosing_functions(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        if name not in CHECKED or (owner.get(node), ast.get_source_segment(source, node)) in KNOWN_SAFE_CALLS:
            continue
        where = f"line {node.lineno}: `{ast.get_source_segment(source, node)[:80]}`"
        if name in FORBIDDEN:
            found.append(f"{where}: {name} {FORBIDDEN[name]}")
        elif name == "torch.load" and not _is_const(_keyword(node, "weights_only"), True):
            found.append(f"{where}: torch.load without weights_only=True")
        elif name == "numpy.load" and not _is_const(_keyword(node, "allow_pickle"), False):
            found.append(f"{where}: numpy.load without allow_pickle=False")
        elif name in ("yaml.load", "yaml.load_all"):
            loader = _keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            loader_name = _dotted(loader, aliases) if loader is not None else None
            if loader_name is None or loader_name.split(".")[-1] not in SAFE_YAML_LOADERS:
                found.append(f"{where}: {name} without a safe Loader")
    return found


def test_the_package_never_unpickles():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20  # the scan sees the whole package, not an empty folder
    problems = [
        f"{f.relative_to(PACKAGE.parent)} {p}"
        for f in files
        for p in problems_in_source(f.read_text(encoding="utf-8"), str(f))
    ]
    assert not problems, "unsafe loading in the package:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "code",
    [
        "import torch\ntorch.load(p)",
        "import torch\ntorch.load(p, map_location='cpu', weights_only=False)",
        "from torch import load\nload(p)",
        "import torch as t\nt.load(\n    p,\n    map_location='cpu',\n)",
        "import numpy as np\nnp.load(p)",
        "import numpy\nnumpy.load(p, allow_pickle=True)",
        "from numpy import load as l\nl(p, mmap_mode='r')",
        "import pickle\npickle.load(f)",
        "import pickle as pk\npk.loads(b)",
        "from pickle import Unpickler\nUnpickler(f).load()",
        "import yaml\nyaml.load(text)",
        "import yaml\nyaml.load(text, Loader=yaml.FullLoader)",
        "import yaml\nyaml.unsafe_load(text)",
        "import yaml\nyaml.full_load(text)",
        "import pandas as pd\npd.read_pickle(p)",
        "import torch\ntorch.jit.load(p)",
        "import marshal\nmarshal.loads(b)",
        "x = dict(allow_pickle=True)",
    ],
)
def test_the_scan_catches_each_unsafe_form(code):
    assert problems_in_source(code), code


@pytest.mark.parametrize(
    "code",
    [
        "import torch\ntorch.load(p, map_location='cpu', weights_only=True)",
        "import numpy as np\nnp.load(p, allow_pickle=False)",
        "import yaml\nyaml.safe_load(text)",
        "import yaml\nyaml.load(text, Loader=yaml.SafeLoader)",
        "import yaml\nyaml.load(text, yaml.CSafeLoader)",
        "import pickle\nraise pickle.UnpicklingError('x')",
        "import json\njson.loads(s)",
    ],
)
def test_the_scan_lets_safe_forms_pass(code):
    assert problems_in_source(code) == []
