"""Output paths checked before any work starts (an hour of training must not end in a traceback because
`--save` is a folder): UserError naming the option, the path and what is wrong with it."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from ditbench.core.errors import UserError, shorten
from ditbench.files.fileio import check_target, file_kind

NPZ = ("an ADM .npz batch", (".npz",))  # check_file_target's `writes` for the array files


def _check_ancestors(path: Path, start: Path, what: str, verb: str) -> None:
    """UserError when the first existing one of `start` and its ancestors is not a folder (so nothing
    can be made below it)."""
    for parent in (start, *start.parents):
        if os.path.lexists(parent):
            if not parent.is_dir():
                raise UserError(
                    f"{what} {shorten(str(path))} cannot be {verb}: {shorten(str(parent))} is a file, "
                    "not a folder."
                )
            return


def ensure_dir(path: str | Path, what: str, *, probe: bool = True) -> Path:
    """Create the folder `path` (`what` in messages: "--out") if missing and check that files can be
    written in it; probe=False skips the write test (the caller's next write reports its own failure)."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        kind = "a file" if path.is_file() else "not a folder"
        raise UserError(f"{what} {shorten(str(path))} is {kind}; give a folder (it is created if missing).")
    _check_ancestors(path, path.parent, what, "created")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{what} {shorten(str(path))} cannot be created: {err.strerror or err}.") from None
    if probe:
        try:
            fd, tmp = tempfile.mkstemp(dir=path, prefix=".ditbench-write-test.")
            os.close(fd)
            os.unlink(tmp)
        except OSError as err:
            raise UserError(
                f"{what} {shorten(str(path))} is not writable ({err.strerror or err}); give a folder you can "
                "write in."
            ) from None
    return path


def check_file_target(
    path: str | Path,
    what: str,
    *,
    create_parent: bool = True,
    writes: tuple[str, tuple[str, ...]] | None = None,
) -> Path:
    """A path a command will write one file to: nothing there yet, or a regular file it may replace
    (fileio.check_target), in a folder that can be written in (create_parent=False: one that can be
    created). writes=(format, suffixes): the name must say the format (`fid --out x.npz` is refused)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise UserError(f"{what} {shorten(str(path))} is a folder; give the path of a file to write.")
    if writes is not None and not path.name.lower().endswith(writes[1]):
        raise UserError(
            f"{what} {shorten(str(path))}: ditbench writes {writes[0]} there, and the name must say so: give "
            f"a name ending in {' or '.join(writes[1])} (e.g. {path.stem or 'out'}{writes[1][0]})."
        )
    check_target(path, what)
    parent = path.parent if str(path.parent) else Path(".")
    _check_ancestors(path, parent, what, "written")
    if create_parent:
        ensure_dir(parent, f"the folder of {what}")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UserError(f"{what} {shorten(str(path))} exists and is not writable.")
    return path


def check_kept(folder: str | Path, entries: dict[str, bool], what: str = "--out") -> None:
    """UserError unless each of `entries` (a name the command keeps in `folder` -> True for a folder,
    False for a regular file changed in place) that exists is exactly that, by lstat: no link, FIFO,
    folder in a file's place or second hard link (fileio.check_target)."""
    folder = Path(folder)
    for name, want_dir in entries.items():
        path = folder / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if want_dir and stat.S_ISDIR(st.st_mode):
            continue
        if want_dir and not stat.S_ISLNK(st.st_mode):
            kind = "a file, not a folder" if stat.S_ISREG(st.st_mode) else "not a folder"
            raise UserError(
                f"{what} {shorten(str(folder))} holds {name}, which is {kind}; ditbench keeps {name} there "
                f"as a folder. Move it away, or give another {what}."
            )
        check_target(path, what, in_place=True, st=st)


_SAFE = "A-Za-z0-9._=-"


def safe_component(text: Any, limit: int = 80) -> str:
    """Record text (a run_id, a cell id) as one file or folder name: itself when it is only letters,
    digits and `._=-` (not `.` or `..`); else those characters, `_` for the rest, and a hash of the
    whole text, so two texts never share a name and no text reaches outside its folder."""
    text = str(text)
    if re.fullmatch(f"[{_SAFE}]{{1,{limit}}}", text) and text not in (".", ".."):
        return text
    slug = re.sub(f"[^{_SAFE}]+", "_", text).strip("._")[:limit]
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{slug}-{digest}" if slug else digest


def inside(root: str | Path, relative: Any) -> Path | None:
    """`root / relative` resolved (links followed), or None when it leads outside `root` (an absolute
    path, `..`, a link out) or cannot be a path (a NUL, a lone surrogate): for paths a record holds."""
    if not isinstance(relative, str):
        return None
    try:
        base = Path(root).resolve()
        path = (base / relative).resolve()
    except (OSError, ValueError, RuntimeError):  # ValueError: NUL, UnicodeEncodeError; RuntimeError: a loop
        return None
    return path if path.is_relative_to(base) else None


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: the same resolved path, or (hard links) the same inode."""
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_output_as_input(
    outputs: list[tuple[str, str | Path | None]], inputs: list[tuple[str, str | Path | None]]
) -> None:
    """UserError when a path a command writes (what the message calls it, path or None) is a file it
    reads; an input folder also stands for its results.jsonl (run folders given to report, compare)."""
    expanded = [(label, Path(path)) for label, path in inputs if path is not None]
    expanded += [(label, path / "results.jsonl") for label, path in expanded if path.is_dir()]
    for out_label, out in outputs:
        if out is None:
            continue
        for in_label, given in expanded:
            if same_file(out, given):
                raise UserError(
                    f"{out_label} {shorten(str(Path(out)))} is the input {in_label} {shorten(str(given))}: "
                    f"writing it would replace what this command reads. Give another path for {out_label}."
                )


def step_summary() -> str | None:
    """$GITHUB_STEP_SUMMARY checked before any work: a regular file with one hard link (it is appended
    to); None when unset or /dev/null."""
    path = os.environ.get("GITHUB_STEP_SUMMARY") or None
    if path is None or path == os.devnull:
        return None
    try:
        check_target(path, "$GITHUB_STEP_SUMMARY", in_place=True)
    except UserError as err:
        raise UserError(
            f"{err} (the summary is appended to a regular file, which GitHub Actions creates for each step; "
            "unset $GITHUB_STEP_SUMMARY for none)"
        ) from None
    return path


def not_a_file(path: str | Path) -> str | None:
    """Why `path` is not a regular file a command can read (not opened), or None: "does not exist" only
    when nothing is there; a FIFO, device, socket, folder or broken link is named for what it is."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "is a broken link" if os.path.islink(path) else "does not exist"
    except (OSError, ValueError) as err:
        return f"cannot be read ({getattr(err, 'strerror', None) or err})"
    if stat.S_ISREG(st.st_mode):
        return None
    kind = file_kind(st.st_mode)
    return f"is {kind}, not a file" if kind else "is not a regular file"
