"""ditbench: benchmark and evaluate Diffusion Transformer (DiT) training.

`ditbench.load_results(path)`: results.jsonl files as a DataFrame, imported on first use (no pandas or
torch on `import ditbench`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_results"]

if TYPE_CHECKING:
    from ditbench.report.load import load_results


def __getattr__(name: str) -> Any:
    if name == "load_results":
        from ditbench.report.load import load_results

        return load_results
    raise AttributeError(f"module 'ditbench' has no attribute {name!r}")
