"""Host memory helpers (``hostmem.py``): an array's address, and ``Addresses``, which
remembers the addresses of views that come again."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from erlcuda.hostmem import Addresses, address


def test_a_views_address_is_its_first_elements_and_remembered() -> None:
    base = np.zeros(100, np.float32)
    view = base[10:20]
    addresses = Addresses()
    assert addresses(view) == address(view) == address(base) + 40
    assert addresses._known[id(view)][1] == address(view)
    assert addresses(view) == address(view)  # the remembered one


def test_an_array_that_owns_its_data_is_not_remembered() -> None:
    """Its data may move (``resize``): its address is read each time."""
    owner = np.zeros(100, np.float32)
    addresses = Addresses()
    assert addresses(owner) == address(owner)
    assert id(owner) not in addresses._known
    owner.resize(1 << 20, refcheck=False)  # may move it
    assert addresses(owner) == address(owner)


def test_an_array_gone_is_never_taken_for_another_given_its_id() -> None:
    """A remembered entry whose array is gone (its weak reference dead) is not used for
    the array that now has that id."""
    base = np.zeros(100, np.float32)
    view = base[5:]

    class Gone:
        pass

    gone = Gone()
    dead = weakref.ref(gone)
    del gone
    gc.collect()
    assert dead() is None
    addresses = Addresses()
    addresses._known[id(view)] = (dead, 12345)  # type: ignore[assignment]
    assert addresses(view) == address(view) != 12345


def test_at_most_limit_arrays_are_remembered() -> None:
    base = np.zeros(1000, np.float32)
    views = [base[i:] for i in range(Addresses.LIMIT + 5)]
    addresses = Addresses()
    for v in views:
        assert addresses(v) == address(v)
    assert 0 < len(addresses._known) <= Addresses.LIMIT
