"""The Wilson interval at the edges a durability benchmark lives on."""

from __future__ import annotations

import pytest

from durabl.bench.stats import percentile, wilson


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
        (98, 100, 0.9300, 0.9945),
    ],
)
def test_wilson_matches_published_values(k: int, n: int, low: float, high: float) -> None:
    got = wilson(k, n)
    assert got[0] == pytest.approx(low, abs=1e-4) and got[1] == pytest.approx(high, abs=1e-4)


def test_no_trials_says_nothing() -> None:
    assert wilson(0, 0) == (0.0, 1.0)


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 95) == 5.0
    assert percentile(list(map(float, range(101))), 95) == 95.0
    assert percentile([], 95) is None
