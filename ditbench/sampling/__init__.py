"""Sampling (`ditbench sample`): class-conditional samples from a DiT checkpoint into an ADM batch `.npz`:
`cli` (the command), `sampler` (the library: `sample`, `make_shard`, model and VAE loading), `shards`
(the plan and its files)."""
