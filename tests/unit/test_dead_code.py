"""No dead code: vulture finds nothing in the package at 80% confidence (unused imports, variables,
unreachable code). A finding is fixed where it stands, never whitelisted."""

from __future__ import annotations

from pathlib import Path

import pytest

vulture = pytest.importorskip("vulture", reason="vulture is in the `test` extra: pip install -e '.[test]'")

PACKAGE = Path(__file__).resolve().parents[2] / "ditbench"


def test_vulture_reports_nothing_in_the_package():
    scan = vulture.Vulture()
    scan.scavenge([str(PACKAGE)])
    found = [
        f"{Path(item.filename).relative_to(PACKAGE.parent)}:{item.first_lineno}: {item.message}"
        for item in scan.get_unused_code(min_confidence=80)
    ]
    assert found == [], "dead code:\n" + "\n".join(found)
