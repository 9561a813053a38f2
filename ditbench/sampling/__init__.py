"""Sampling (`ditbench sample`): class-conditional samples from a DiT checkpoint into an ADM batch `.npz`.

Defaults follow the DiT paper's FID protocol: 50,000 samples with equal counts per class
(sample i has label i mod num_classes), classifier-free guidance at scale 1.5, ancestral
DDPM over 250 respaced steps, and the sd-vae-ft-ema decoder. The output is what the ADM
evaluator and `ditbench fid` read: `arr_0` uint8 (N, H, W, 3) and `arr_1` int64 labels (N,).

Work is cut into shards of `--batch-size` samples. Shard k holds samples
[k*B, (k+1)*B), draws all its noise from its own generator seeded from (seed, k), and is
written atomically to `<out>.shards/shard_<k>.npz`. So:

- under torchrun each rank takes shards k with k mod world_size == rank, and the images do
  not depend on how many ranks made them (on the same kind of device);
- an interrupted run restarted with the same options skips the shards on disk and makes the
  others, and the merged npz equals an uninterrupted run's;
- the same seed gives the same npz twice.

When every shard exists, rank 0 merges them in order into `--out` (atomically), writes
`<out stem>.json` (settings, images/s, environment) and removes the shard folder.

The package: `cli` (the command), `sampler` (the library: `sample`, `make_shard`), `shards` (the
plan and its files), `weights` (model and VAE loading, kept per process).
"""
