"""More of the planner pinned by value (issue 27, mutation testing of ditbench/plan/): the dispatch
memo, the rendering of plans and the search bounds, each expected value worked out here from the
rule it checks, without tracing a model. reports/mutation/plan.md lists the mutants each test was
added for.
"""

from __future__ import annotations

import pytest

from ditbench.plan import batch


# ---- batch.py: the probe batch's prime search -----------------------------------------------------


@pytest.mark.parametrize("n, prime", [(0, False), (1, False), (2, True), (3, True), (4, False), (9, False),
                                      (25, False), (49, False), (97, True), (4099, True), (4101, False)])  # fmt: skip
def test_is_prime_by_trial_division(n, prime):
    assert batch._is_prime(n) is prime
