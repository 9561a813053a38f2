"""The quality loop: sample-quality metrics for trained cells: `evaluation` (sample, decode, score per
seed; the sample grid all cells share), `loop` (a cell's quality phase); the report's side is
`ditbench.report.quality`, the gate's `ditbench.report.gate.quality`."""
