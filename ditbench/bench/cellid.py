"""Cell ids: a short stable hash a rerun uses to recognise finished cells.

The id hashes only what differs from the defaults (`CellSpec.identity`), so adding a knob with a
default leaves every existing id as it was.
"""

from __future__ import annotations

import hashlib
import json

from ditbench.cellspec import CellSpec

ID_CHARS = 12  # hex characters of the sha256: 48 bits, no collision within any real suite


def cell_id(spec: CellSpec) -> str:
    """Short stable hash of the cell (key order and defaults left implicit do not matter)."""
    text = json.dumps(spec.identity(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:ID_CHARS]
