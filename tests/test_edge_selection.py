"""Seeded device selection of the edge job: stable device ids and a seeded balanced sampler."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsim_flare.edge.selection import SeededDeviceManager, leaf_device_prefix
from processors.edge_task_processor import device_number


def _manager(seed: int, leaves: dict[str, int], selection: int = 4) -> SeededDeviceManager:
    manager = SeededDeviceManager(device_selection_size=selection, initial_min_client_num=len(leaves), seed=seed)
    for leaf, count in leaves.items():
        for i in range(count):
            manager.device_client_map[f"{leaf_device_prefix(leaf)}#{i}"] = leaf
    return manager


def _pick(manager: SeededDeviceManager, selection_number: int, holes: int, usable=None) -> set[str]:
    manager.current_selection_version = selection_number
    return manager._balanced_device_sampling(set(usable or manager.device_client_map), holes)


def test_prefixes_do_not_shadow_each_other_and_keep_device_numbers():
    assert not f"{leaf_device_prefix('site-10')}#3".startswith(leaf_device_prefix("site-1"))
    assert device_number(f"{leaf_device_prefix('site-2')}#3", leaf_index=1, devices_per_leaf=8) == 11


def test_same_seed_and_selection_number_give_the_same_devices():
    leaves = {"site-1": 8, "site-2": 8}
    first = [_pick(_manager(7, leaves), n, 4) for n in range(1, 6)]
    again = [_pick(_manager(7, leaves), n, 4) for n in range(1, 6)]
    other_seed = [_pick(_manager(8, leaves), n, 4) for n in range(1, 6)]
    assert first == again
    assert first != other_seed
    assert len({frozenset(s) for s in first}) > 1, "selections vary from one selection to the next"


def test_selection_ignores_the_order_devices_were_reported_in():
    leaves = {"site-1": 6, "site-2": 6}
    forward = _manager(3, leaves)
    backward = SeededDeviceManager(device_selection_size=4, initial_min_client_num=2, seed=3)
    backward.device_client_map = dict(reversed(list(forward.device_client_map.items())))
    assert _pick(forward, 2, 5) == _pick(backward, 2, 5)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.sampled_from([f"site-{i}" for i in range(1, 7)]), st.integers(0, 9), min_size=1),
    st.integers(1, 40),
    st.integers(0, 2**31 - 1),
)
def test_selection_is_balanced_and_only_takes_usable_devices(leaves, holes, seed):
    manager = _manager(seed, leaves)
    picked = _pick(manager, 1, holes)
    assert picked <= set(manager.device_client_map)
    assert len(picked) == min(holes, sum(leaves.values()))
    shares = {leaf: sum(manager.device_client_map[d] == leaf for d in picked) for leaf in leaves}
    short = [leaf for leaf in leaves if shares[leaf] < leaves[leaf]]  # leaves with devices left over
    if short:
        assert max(shares.values()) - min(shares[leaf] for leaf in short) <= 1, shares


def test_only_the_balanced_strategy_exists():
    with pytest.raises(TypeError):
        SeededDeviceManager(device_selection_size=2, device_sampling_strategy="random")
