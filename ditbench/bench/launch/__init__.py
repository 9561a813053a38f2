"""How a cell's processes start: a fresh process, ranks through torchrun, or a submitit job's tasks.
Imports bench.cell below it, nothing above."""
