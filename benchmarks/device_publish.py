"""Where the device check's outputs go after every part: --out-dir (reports/gpu) and $OUT.

Four files, each written whole (a temporary file, fsync, rename), so a call killed at any moment
leaves the previous complete version: summary.json, summary.md, cells.jsonl (the records of every
suite the check ran) and logs.tgz (each part's log, the tail of a long one, and the parts' JSON).
$OUT gets the same four files: the device tool returns at most 8 files, at most 2 folders deep,
named with letters, digits, '.', '_' and '-' only, 16 MiB each.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
from pathlib import Path

OUT_FILES = ("summary.json", "summary.md", "cells.jsonl", "logs.tgz")
MAX_FILES = 8
MAX_DEPTH = 2  # folders below $OUT
MAX_FILE_BYTES = 16 * 2**20
LOG_TAIL_BYTES = 2 * 2**20  # of each log in logs.tgz
NAME = re.compile(r"[A-Za-z0-9._-]+")


def write_whole(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def logs_archive(work: Path) -> bytes:
    """A gzipped tar of the logs (their last LOG_TAIL_BYTES) and the parts' JSON and XML results."""
    buf = io.BytesIO()
    members = (
        sorted((work / "logs").glob("*.log"))
        + sorted(work.glob("*.json"))
        + sorted(work.glob("*.yaml"))
        + sorted(work.glob("*.xml"))
    )
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in members:
            try:
                with open(path, "rb") as f:
                    f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                    data = f.read()
            except OSError:
                continue
            info = tarfile.TarInfo(f"device_check/{path.name}")
            info.size, info.mtime = len(data), int(path.stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def cells_jsonl(records: dict[str, list[dict]]) -> bytes:
    lines = [json.dumps({**r, "device_check_part": part}) for part, rs in records.items() for r in rs]
    return ("\n".join(lines) + "\n" if lines else "").encode()


def check_outputs(root: Path) -> list[str]:
    """What the device tool would not bring back from `root`: too many files, too deep, odd names."""
    problems, files = [], []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if not all(NAME.fullmatch(part) for part in rel.parts):
            problems.append(f"{rel}: a name outside [A-Za-z0-9._-]")
        if path.is_file():
            files.append(rel)
            if len(rel.parts) - 1 > MAX_DEPTH:
                problems.append(f"{rel}: more than {MAX_DEPTH} folders deep")
            if path.stat().st_size > MAX_FILE_BYTES:
                problems.append(f"{rel}: over {MAX_FILE_BYTES >> 20} MiB")
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files; at most {MAX_FILES} come back")
    return problems


def publish(
    out_dir: Path,
    out_env: Path | None,
    summary: dict,
    markdown: str,
    records: dict[str, list[dict]],
    work: Path,
) -> None:
    payload = {
        "summary.json": (json.dumps(summary, indent=1, default=str) + "\n").encode(),
        "summary.md": markdown.encode(),
        "cells.jsonl": cells_jsonl(records),
        "logs.tgz": logs_archive(work),
    }
    for name in OUT_FILES:
        write_whole(out_dir / name, payload[name])
    if out_env is not None:
        out_env.mkdir(parents=True, exist_ok=True)
        for name in OUT_FILES:
            tmp = out_env / f"{name}.part"
            shutil.copyfile(out_dir / name, tmp)
            os.replace(tmp, out_env / name)
