"""The finite grids request parameters are mapped onto (issue 14: a bounded key space)."""

from __future__ import annotations

import math
import random

import pytest

from headgraph.core.errors import InvalidInput
from headgraph.core.names import (PERCENT_STEP, THRESHOLD_DIGITS, THRESHOLD_FLOOR,
                                       quantize_percent, quantize_threshold)


def test_thresholds_round_to_significant_digits_and_are_idempotent():
    rng = random.Random(0)
    values = [rng.uniform(-1, 1) * 10 ** rng.uniform(-8, 6) for _ in range(5000)]
    grid = set()
    for v in values:
        q = quantize_threshold(v)
        assert quantize_threshold(q) == q
        if abs(v) < THRESHOLD_FLOOR:
            assert q == 0.0
            continue
        assert abs(q - v) <= 0.5 * 10 ** (math.floor(math.log10(abs(v))) - THRESHOLD_DIGITS + 1) * (1 + 1e-9)
        grid.add(q)
    # Per decade at most 9 * 10**(digits-1) distinct values (both signs): a finite key space.
    decades = {math.floor(math.log10(abs(q))) for q in grid}
    assert len(grid) <= 2 * 9 * 10 ** (THRESHOLD_DIGITS - 1) * len(decades)
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(InvalidInput):
            quantize_threshold(bad)


def test_percentages_are_multiples_of_the_step():
    rng = random.Random(1)
    for _ in range(2000):
        v = rng.uniform(1e-6, 100)
        q = quantize_percent(v)
        steps = q / PERCENT_STEP
        assert abs(steps - round(steps)) < 1e-6 and PERCENT_STEP <= q <= 100
        assert abs(q - v) <= PERCENT_STEP / 2 + 1e-9 or v < PERCENT_STEP
        assert quantize_percent(q) == q
    for bad in (0, -1, 100.01, math.nan):
        with pytest.raises(InvalidInput):
            quantize_percent(bad)
