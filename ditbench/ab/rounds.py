"""The rounds of `ditbench ab`: every open cell once per side, each a fresh process, its record appended
at once. Interleaved: cells, and each cell's two processes back to back, in a random order (drift hits
both, neither is always first). Duet: both at once, each pinned to a half of the CPUs (and GPUs), the
halves drawn again for every pair."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ditbench.ab.sides import Side
from ditbench.bench.inflight import Ticket, make_record, read_result, record_context
from ditbench.bench.launch.process import MODULE, TORCHRUN_MODULE, FreshProcess
from ditbench.bench.runner import Visible, precheck
from ditbench.bench.runopts import LOGS_DIR, RESULTS_FILE, now_iso
from ditbench.core.errors import UserError
from ditbench.files.fileio import mkdir_real
from ditbench.records.jsonl import append_record
from ditbench.records.metrics import STEP_MS
from ditbench.records.model import Record, RecordError
from ditbench.spec.suite import Suite, SuiteCell

WORK_DIR = ".ab"  # spec and result files between the ab process and a cell's process


def halves(items: list) -> tuple[list, list]:
    return items[: len(items) // 2], items[len(items) // 2 :]


class Rounds:
    """Runs cells for both sides; remembers each record's file and line (for the gate's messages)."""

    def __init__(self, suite: Suite, sides: tuple[Side, Side], out: Path, run_id: str, rounds: int, **how):
        self.suite, self.sides, self.out, self.run_id, self.rounds = suite, sides, out, run_id, rounds
        self.rng: random.Random = how["rng"]
        self.timeout_s: float | None = how.get("timeout_s")
        self.say: Callable[[str], None] = how["say"]
        self.visible = Visible.detect()
        self.duet = bool(how.get("duet"))
        if self.duet and self.visible.gpu_count < 2 and any(c.spec.device == "cuda" for c in how["cells"]):
            self.duet = False  # two processes sharing one GPU would each measure the other's kernels
            self.say("--duet needs a GPU per side; with fewer than 2 GPUs the cells run interleaved")
        self.work = mkdir_real(out / WORK_DIR, "--out")
        self.paths = {s.name: out / s.name.lower() / RESULTS_FILE for s in sides}
        self.lines = {name: _line_count(path) for name, path in self.paths.items()}
        self.where: dict[tuple[str, str, int], str] = {}  # (side, cell_id, round) -> "path:line"
        self.cpus = halves(sorted(_affinity())) if self.duet else None
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")  # the GPUs this process sees, as the parent names them
        gpus = shown.split(",") if shown else [str(i) for i in range(self.visible.gpu_count)]
        gpus = gpus[: self.visible.gpu_count]
        self.gpus = halves(gpus) if self.duet and len(gpus) >= 2 else None
        if self.duet and len(self.cpus[0]) < 1:
            raise UserError("--duet needs at least 2 CPUs to give each side its own; this process may use 1.")

    def one(self, cell: SuiteCell, side: Side, round_no: int, share: int | None = None) -> Record:
        """Run (or, where it cannot run here, decide) one cell for one side; append and return its record.
        `share`: duet's half (0 or 1) of the CPUs and GPUs."""
        ticket = Ticket(self.work, f"{side.name}.{cell.cell_id}.r{round_no}")
        started, t0 = now_iso(), time.monotonic()
        verdict = precheck(cell, self.visible)
        if verdict is not None:
            result: dict[str, Any] = {"status": verdict[0], "reason": verdict[1]}
        else:
            env, cpus = dict(side.env), None
            if share is not None:
                cpus = frozenset(self.cpus[share])
                env.setdefault("OMP_NUM_THREADS", str(len(cpus)))
                if self.gpus is not None:
                    env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(self.gpus[share]))
            module = MODULE if cell.spec.world_size == 1 else TORCHRUN_MODULE
            launcher = FreshProcess(module, side.python, env, cpus)
            log = self.out / LOGS_DIR / self.run_id / side.name.lower() / f"{cell.cell_id}.r{round_no}.log"
            about = {"cell_id": cell.cell_id, "cell_name": cell.cell_name, "rendezvous": None}
            about["out_dir"] = str(self.paths[side.name].parent.resolve())  # a side's sample grids: its own
            timeout = self.timeout_s or cell.timeout_s
            try:
                launcher.launch(cell.spec, about, timeout, ticket.spec_path, ticket.result_path, log)
                result, problem = read_result(ticket.result_path)
            finally:
                ticket.remove()
            if result is None:
                result = {"status": "error", "reason": f"the cell finished but {problem}"}
        # a round is a repeat: `ditbench report` combines a side's rounds as it does repeats
        context = record_context(
            self.suite, self.run_id, cell, started, label=f"ab side {side.name}", repeat=round_no,
            repeats=self.rounds,
        )  # fmt: skip
        try:
            record = append_record(self.paths[side.name], make_record(context, result, time.monotonic() - t0))
        except RecordError as err:
            raise UserError(
                f"side {side.name}'s result for cell {cell.cell_name} (round {round_no}) is {err}: that "
                "side's ditbench does not write what this one reads. Both sides must be ditbench versions "
                "that write the same record."
            ) from None
        self.lines[side.name] += 1
        self.where[(side.name, cell.cell_id, round_no)] = f"{self.paths[side.name]}:{self.lines[side.name]}"
        return record

    def round(self, cells: list[SuiteCell], round_no: int) -> dict[tuple[str, str], Record]:
        """(cell_id, side) -> record for every cell, in this round's random order."""
        out: dict[tuple[str, str], Record] = {}
        for cell in self.rng.sample(cells, len(cells)):
            sides = list(self.sides)
            if self.rng.random() < 0.5:
                sides.reverse()  # which side goes first (interleaved) or gets the first half (duet)
            if self.duet:
                self._together(cell, sides, round_no, out)
            else:
                for side in sides:
                    out[(cell.cell_id, side.name)] = self._said(
                        self.one(cell, side, round_no), side, round_no
                    )
        return out

    def _together(self, cell: SuiteCell, sides: list[Side], round_no: int, out: dict) -> None:
        errors: list[BaseException] = []

        def run(side: Side, share: int) -> None:
            try:
                out[(cell.cell_id, side.name)] = self.one(cell, side, round_no, share)
            except BaseException as err:  # raised again in the main thread
                errors.append(err)

        threads = [threading.Thread(target=run, args=(s, i), daemon=True) for i, s in enumerate(sides)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        for side in sides:
            self._said(out[(cell.cell_id, side.name)], side, round_no)

    def _said(self, record: Record, side: Side, round_no: int) -> Record:
        step = STEP_MS.of(record)
        how = f"{step:.2f} ms a step" if isinstance(step, (int, float)) else record.get("reason") or ""
        self.say(f"round {round_no} {side.name} {record.cell_name}: {record.status} {how}".rstrip())
        return record


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux: every CPU
        return set(range(os.cpu_count() or 1))


def _line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0
