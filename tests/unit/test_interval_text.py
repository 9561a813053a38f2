"""A value and its interval read together, to the decimals the interval justifies (core/intervals.py)."""

from __future__ import annotations

import math

import pytest

from ditbench.core.intervals import decimals, plus_minus, with_ends


@pytest.mark.parametrize(
    "value, spread, fmt, text",
    [
        (72.9574, 35.2100, "{:.4f}", "73 ± 35"),  # a FID ± tens: no decimals
        (1338.8424, 320.1857, "{:.4f}", "1339 ± 320"),  # the integer part is never rounded away
        (1.7872, 0.1091, "{:.4f}", "1.79 ± 0.11"),  # two significant digits of the spread
        (0.0156, 0.0232, "{:.4f}", "0.016 ± 0.023"),
        (0.000123, 0.0000045, "{:.6f}", "0.000123 ± 0.000005"),  # never more than the metric's own format
        (0.0, 0.0, "{:.4f}", "0.0000 ± 0.0000"),  # no spread to go by: the own format
        (5.0, None, "{:.4f}", "5.0000"),
        (5.0, math.nan, "{:.4f}", "5.0000"),
        (3.0, 1.0, "{:.3g}", "3 ± 1"),  # a format that is not fixed-point stays as it is
    ],
)
def test_plus_minus(value, spread, fmt, text):
    assert plus_minus(value, spread, fmt) == text


def test_with_ends_takes_the_decimals_of_the_half_width():
    assert with_ends(50.0, 45.5, 55.6, "{:.1f}") == ("50.0", "45.5", "55.6")  # half-width 5.05
    assert with_ends(400.0, 320.0, 500.0, "{:.1f}") == ("400", "320", "500")  # half-width 90
    assert with_ends(12345.6, 12000.0, 12700.0, "{:,.1f}") == ("12,346", "12,000", "12,700")
    assert with_ends(2.5, 2.5, 2.5, "{:.2f}") == ("2.50", "2.50", "2.50")
    assert with_ends(2.5, -math.inf, 3.0, "{:.2f}") == ("2.50", "-inf", "3.00")


def test_decimals():
    assert [decimals(h, 4) for h in (35.2, 9.99, 1.0, 0.5, 0.05, 0.00001)] == [0, 1, 1, 2, 3, 4]
    assert decimals(None, 3) == decimals(0.0, 3) == decimals(-1.0, 3) == 3


def test_the_summary_line_takes_the_intervals_precision():
    from ditbench.bench.summary import rate_text

    wide = {"images_per_s": 400.04, "repeats": {"images_per_s_ci": [320.0, 500.0], "count": 3}}
    assert rate_text(wide) == "400 (95% CI 320-500, 3 runs)"  # was 400.0 (95% CI 320.0-500.0, ...)
    narrow = {"images_per_s": 50.04, "repeats": {"images_per_s_ci": [45.5, 55.6], "count": 3}}
    assert rate_text(narrow) == "50.0 (95% CI 45.5-55.6, 3 runs)"
    missing = {"images_per_s": None, "repeats": {"images_per_s_ci": [45.5, 55.6], "count": 3}}
    assert rate_text(missing) == "- (95% CI 45.5-55.6, 3 runs)"
