"""The sequential gate of `ditbench ab`: after every round, the whole comparison again, the timed metrics
judged from the rounds' paired log(step B / step A) ratios at the level of the cell's look. A cell
closes when its timed verdicts are decided or a side's process did not end ok."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ditbench.bench.repeats import combine
from ditbench.core.errors import UserError
from ditbench.records.metrics import IMAGES_PER_S, STEP_MS, table
from ditbench.records.model import Record
from ditbench.report.gate.decide import compare_frames
from ditbench.report.gate.inputs import number
from ditbench.report.gate.policy import Policy
from ditbench.report.gate.result import Comparison
from ditbench.report.gate.timing import judge_paired, look_alpha
from ditbench.spec.suite import SuiteCell


@dataclass
class CellState:
    cell: SuiteCell
    records: dict[str, list[Record]] = field(default_factory=lambda: {"A": [], "B": []})
    rounds: list[int] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # log(step B / step A), rounds both ran ok
    level: float = 0.0  # the level of its latest look
    open: bool = True


class Gate:
    def __init__(
        self, cells: list[SuiteCell], policy: Policy, max_rounds: int, where: dict, paths: tuple[str, str]
    ):
        self.states = {c.cell_id: CellState(c) for c in cells}
        self.policy, self.max_rounds, self.where, self.paths = policy, max_rounds, where, paths

    @property
    def open(self) -> list[SuiteCell]:
        return [s.cell for s in self.states.values() if s.open]

    def add(self, round_no: int, records: dict[tuple[str, str], Record]) -> None:
        """A round's records ((cell_id, side) -> record) for the cells that ran in it."""
        for cid, st in self.states.items():
            if (cid, "A") not in records:
                continue
            pair = [records[(cid, side)] for side in ("A", "B")]
            for side, record in zip(("A", "B"), pair, strict=True):
                st.records[side].append(record)
            st.rounds.append(round_no)
            if all(r.status == "ok" for r in pair):
                a, b = (self._step_ms(r, side, round_no) for r, side in zip(pair, ("A", "B"), strict=True))
                st.ratios.append(math.log(b / a))
            else:
                st.open = False  # a side that did not end ok: the status decides

    def _step_ms(self, record: Record, side: str, round_no: int) -> float:
        for metric in (STEP_MS, IMAGES_PER_S):
            value, why = number(metric.of(record))
            if why is not None or value is None or value <= 0:
                where = self.where.get((side, record.cell_id, round_no), side)
                raise UserError(
                    f"side {side}'s record {where} (cell {record.cell_name}, round {round_no}) has "
                    f"{metric.path} {why or ('missing' if value is None else f'{value:g}')}, not a positive "
                    "number: that side's ditbench does not write what this one's gate reads. Both sides "
                    "must be ditbench versions that write the same record."
                )
        return STEP_MS.of(record)

    def judge(self, last: bool) -> Comparison:
        """The comparison after this round; closes the cells it decided. `last`: no round follows, so
        the open cells' looks spend what is left of alpha."""
        for st in self.states.values():
            if st.open and st.ratios:
                st.level = look_alpha(len(st.ratios), self.max_rounds, self.policy.alpha, last)
        frames = [self._frame(side) for side in ("A", "B")]
        result = compare_frames(
            *frames, self.policy, allow_env_mismatch=True, base_path=self.paths[0], new_path=self.paths[1],
            timed=self._timed,
        )  # fmt: skip
        timed = table()
        for cell in result.cells:
            st = self.states[cell.cell_id]
            if not any(d.verdict == "inconclusive" and timed[d.metric].timed for d in cell.metrics):
                st.open = False
        return result

    def _timed(self, cell_id: str, metric, rule, b: float, n: float):
        st = self.states[cell_id]
        return judge_paired(metric, rule, b, n, st.ratios, st.level)

    def _frame(self, side: str) -> pd.DataFrame:
        rows = []
        for cid, st in self.states.items():
            if st.records[side]:
                source = self.where.get((side, cid, st.rounds[-1]), side)
                rows.append({"record": combine(st.records[side]), "source": source})
        return pd.DataFrame(rows, columns=["record", "source"])

    def about(self) -> dict[str, Any]:
        """Per cell: the rounds it ran, the level of its last look, its B/A step-time ratios."""
        return {
            st.cell.cell_name: {
                "rounds": len(st.rounds),
                "paired_rounds": len(st.ratios),
                "look_alpha": st.level,
                "ratios": [round(math.exp(x), 5) for x in st.ratios],
            }
            for st in self.states.values()
        }
