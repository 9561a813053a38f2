"""ditbench: benchmark and evaluate Diffusion Transformer (DiT) training.

`ditbench.load_results(path)` reads results.jsonl files into a pandas DataFrame (one row per
result record; see `ditbench.report.load`). It is imported on first use, so `import ditbench`
stays light: it pulls in neither pandas nor torch.
"""

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
