"""ditbench: benchmark and evaluate Diffusion Transformer (DiT) training."""

__version__ = "0.1.0"
