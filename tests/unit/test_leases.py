"""How often a runtime renews the leases it holds (``durabl.leases``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from durabl.leases import RENEW_MAX_S, Leaser
from durabl.store import open_store


@pytest.mark.parametrize(("lease_s", "every_s"), [(6.0, 2.0), (15.0, 5.0), (600.0, RENEW_MAX_S)])
def test_a_lease_is_renewed_each_third_of_it_and_never_less_often_than_the_cap(
    tmp_path: Path, lease_s: float, every_s: float
) -> None:
    store = open_store(str(tmp_path / "runs.db"))
    try:
        assert Leaser(store, "owner-1", lease_s).renew_every_s == every_s
    finally:
        store.close()
