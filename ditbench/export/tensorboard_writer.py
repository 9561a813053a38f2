"""Write TrackerRuns as TensorBoard runs: one folder of event files per cell under the target folder.

Each cell's knobs and tags are its HParams (the HParams dashboard compares cells by them), its
metrics are scalars at step 0 and also the HParams metrics, series are scalars at their steps, grids
are images at their step and the record's identity is a text summary. The report is a run of its own
(`report-<id>`): report.md as text and its plots as images. A folder that already holds event files
is left as it is (the record was exported before), so exporting twice adds nothing twice.
Written through torch's SummaryWriter, which needs the tensorboard package (the `tensorboard` extra).
"""

from __future__ import annotations

from pathlib import Path

from ditbench.escape import md_text
from ditbench.export.runs import TrackerRun
from ditbench.extras import require_extra
from ditbench.fileio import mkdir_real
from ditbench.imageload import GRID_PIXELS, load_rgb


def _exported(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("events.out.tfevents.*"))


def _png(path: Path):
    import numpy as np

    return np.asarray(load_rgb(path, GRID_PIXELS, "a sample grid"))  # its size checked first, from the header


def _identity(run: TrackerRun) -> str:  # markdown TensorBoard renders: a record's text escaped
    rows = "\n".join(f"| {md_text(k)} | {md_text(v)} |" for k, v in sorted(run.tags.items()))
    return f"**{md_text(run.name)}**\n\n| key | value |\n|---|---|\n{rows}"


def write_run(folder: Path, run: TrackerRun) -> None:
    require_extra("tensorboard", "tensorboard", "ditbench export --to tensorboard")
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    hparam_dict = {**run.params, **{f"tag.{k}": v for k, v in run.tags.items() if k in ("status", "label")}}
    with SummaryWriter(log_dir=str(folder)) as writer:
        for summary in hparams(hparam_dict, run.metrics):
            writer.file_writer.add_summary(summary)
        for tag, value in run.metrics.items():
            writer.add_scalar(tag, value, 0)
        for tag, points in run.series.items():
            for step, value in points:
                writer.add_scalar(tag, value, step)
        for tag, step, path in run.images:
            writer.add_image(tag, _png(path), step, dataformats="HWC")
        writer.add_text("record", _identity(run), 0)


def write_report(folder: Path, files: dict[str, Path]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(folder)) as writer:
        for path in files.values():
            if path.suffix == ".md":
                writer.add_text(f"report/{path.name}", path.read_text(encoding="utf-8"), 0)
            elif path.suffix == ".png":
                writer.add_image(f"report/{path.stem}", _png(path), 0, dataformats="HWC")


def export(runs: list[TrackerRun], target: Path, report: tuple[str, dict[str, Path]] | None) -> dict:
    """Write each run not yet in `target`; {"written": [...], "skipped": [...]} of run folders."""
    require_extra("tensorboard", "tensorboard", "ditbench export --to tensorboard")
    written, skipped = [], []
    for run in runs:
        folder = target / run.key  # one safe folder name (runs.safe_component), made here: never a link
        if _exported(folder):
            skipped.append(str(folder))
            continue
        write_run(mkdir_real(folder, "--to tensorboard"), run)
        written.append(str(folder))
    if report is not None:
        folder = target / f"report-{report[0]}"
        if _exported(folder):
            skipped.append(str(folder))
        else:
            write_report(mkdir_real(folder, "--to tensorboard"), report[1])
            written.append(str(folder))
    return {"written": written, "skipped": skipped}
