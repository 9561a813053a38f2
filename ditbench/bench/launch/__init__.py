"""How a cell's processes start: one fresh process (`process`), or ranks through torchrun (`torchrun`,
`rank`, `rendezvous`), their reports made one record (`aggregate`); shared plumbing in `procs`, `files`."""
