"""How a cell's processes start: the interfaces (`base`), a fresh process (`process`), ranks through
torchrun (`torchrun`, `rank`) or a submitit job's tasks (`srun`, `executors`), their reports made one
record (`aggregate`); shared plumbing in `procs`, `files`. Imports bench.cell below it, nothing above."""
