"""How a cell's processes start: one interface (`base.Launcher`), one fresh process (`process`), or ranks
through torchrun (`torchrun`, `rank`, `rendezvous`) or a submitit job's tasks (`srun`, `executors`), their
reports made one record (`aggregate`); shared plumbing in `procs`, `files`."""
