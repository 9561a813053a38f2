"""Sampling (`ditbench sample`): class-conditional samples from a DiT checkpoint into an ADM batch `.npz`."""
