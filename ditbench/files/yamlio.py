"""The one reader of the YAML users hand us (suites, gate policies, claims): a regular UTF-8 file of at
most MAX_BYTES, no duplicate keys, recursive aliases, nesting beyond MAX_DEPTH or alias expansion beyond
MAX_NODES (a 300-byte "billion laughs"); every failure a UserError naming the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ditbench.core.errors import UserError, shorten

MAX_BYTES = 4 * 2**20  # a suite or policy is a few kilobytes
MAX_DEPTH = 64  # a suite nests about 5 levels deep
MAX_NODES = 200_000  # after alias expansion: far above any real file, far below trouble


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, refusing duplicate keys (the second would silently win)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)  # TypeError: a list or mapping as a key
                except TypeError:
                    problem = "a mapping key must be a plain value, not a list or mapping"
                else:
                    if first is key_node.start_mark:
                        continue
                    problem = (
                        f"duplicate key {shorten(key)} (first at line {first.line + 1}); "
                        "each key may appear once in a mapping"
                    )
                raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _check_node_graph(root: yaml.Node, where: str) -> None:
    """Refuse recursive aliases, deep nesting and alias expansion beyond MAX_NODES (the recursion is
    bounded by MAX_DEPTH; an alias's node is counted once, memoised by identity)."""
    expanded: dict[int, int] = {}  # id(node) -> node count once every alias is expanded
    on_path: set[int] = set()

    def count(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in expanded:
            return expanded[key]
        if key in on_path:
            raise UserError(
                f"{where} at line {node.start_mark.line + 1}: an alias refers to a mapping or list "
                "that contains it (a recursive alias); write the values out instead."
            )
        if depth > MAX_DEPTH:
            raise UserError(
                f"{where} at line {node.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep; "
                "a suite or policy needs only a few levels."
            )
        on_path.add(key)
        children = node.value if isinstance(node, yaml.CollectionNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in children for n in pair]
        expanded[key] = 1 + sum(count(child, depth + 1) for child in children)
        on_path.discard(key)
        if expanded[key] > MAX_NODES:
            raise UserError(
                f"{where} expands to more than {MAX_NODES:,} values through its aliases (`*name`); "
                "a real file is far smaller: remove the repeated aliases."
            )
        return expanded[key]

    count(root, 1)


def parse_yaml_text(text: str, where: str) -> Any:
    """Parse YAML text under every bound above; `where` names the source in messages."""
    loader = _BoundedLoader(text)
    loader.name = where  # error marks then say `in "suite x.yaml", line 3`
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise UserError(
                f"{where} is nested too deeply to read (more than {MAX_DEPTH} levels are never needed)."
            ) from None
        if node is None:
            return None
        _check_node_graph(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise UserError(f"{where} is not valid YAML: {shorten(str(err), 600, quote=False)}") from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path, what: str) -> Any:
    """Read and parse a user's YAML file (`what` says which kind: "suite", "policy", "claims"): it must
    exist, be a regular file, be small enough and be UTF-8."""
    p = Path(path)
    label = f"{what} {shorten(str(p), 200, quote=False)}"
    if p.is_dir():
        raise UserError(f"{label} is a directory; give the path of a {what} file.")
    if not p.exists():
        raise UserError(f"{label} does not exist.")
    if not p.is_file():
        raise UserError(f"{label} is not a regular file (a device, socket or pipe); give a {what} file.")
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise UserError(f"{label} is {size:,} bytes; a {what} file is at most {MAX_BYTES:,} bytes.")
        data = p.read_bytes()
    except PermissionError:
        raise UserError(f"{label} cannot be read (permission denied).") from None
    except OSError as err:
        raise UserError(f"{label} cannot be read: {err.strerror or err}.") from None
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or (data and b"\x00" in data[:4096]):
        raise UserError(f"{label} looks like UTF-16 or binary data; save it as UTF-8 text.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{label} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
            "save it as UTF-8."
        ) from None
    return parse_yaml_text(text, label)
