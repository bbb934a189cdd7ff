"""The edge job's leaves check each device's update before summing it (devsim_flare/edge/screen.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.fl_context import FLContext
from nvflare.edge.aggregators.model_update_dxo import ModelUpdateDXOAggregator

from devsim_flare.edge.job import DevsimEdgeRecipe
from devsim_flare.edge.screen import ScreenedUpdateAggregator, ScreenedUpdateAggrFactory, model_zeros

SETTINGS = {"dataset": "digits", "model": "cnn", "seed": 0}


def _device_update(delta: dict, device: int = 3) -> object:
    return DXO(
        DataKind.WEIGHT_DIFF, {"dict": delta, "count": 1}, meta={"device": device, "num_samples": 20}
    ).to_shareable()


def _deltas(count: int, scale: float = 0.01) -> list[dict]:
    zeros = model_zeros(SETTINGS)
    rng = np.random.default_rng(0)
    return [
        {k: (scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in zeros.items()} for _ in range(count)
    ]


def test_a_leaf_sums_good_updates_and_leaves_out_bad_ones_counting_them(capsys):
    factory = ScreenedUpdateAggrFactory(SETTINGS, max_update_norm=None, update_norm_factor=20.0)
    leaf = factory.get_aggregator()
    ctx = FLContext()
    good = _deltas(6)
    for i, delta in enumerate(good):
        assert leaf.accept(_device_update(delta, i), ctx)
    nan = {k: v.copy() for k, v in good[0].items()}
    nan["conv1.weight"][0] = np.nan
    huge = {k: 1e4 * v for k, v in good[1].items()}
    for bad in (nan, huge, {"conv1.weight": good[0]["conv1.weight"]}):
        assert leaf.accept(_device_update(bad, 99), ctx)  # True: NVFlare's updater ends the job on False
    data = from_shareable(leaf.aggregate(ctx)).data
    assert data["count"] == 6 and data["rejected"] == 3
    for key, value in data["dict"].items():
        np.testing.assert_allclose(value, sum(d[key] for d in good), rtol=1e-5, atol=1e-7)
    printed = capsys.readouterr().out
    assert "device 99 rejected (non_finite)" in printed and "(norm)" in printed and "(keys)" in printed
    assert leaf.rejected == 0 and leaf.dict is None  # aggregate() starts the next sum


def test_a_sum_of_only_rejected_updates_reports_zeros_and_parents_add_up_the_rejections():
    """A leaf whose devices were all rejected still reports its devices (so versions keep coming) with zeros;
    a relay or the server adds the sums and their rejections without checking them again."""
    factory = ScreenedUpdateAggrFactory(SETTINGS)
    ctx = FLContext()
    first, second = factory.get_aggregator(), factory.get_aggregator()
    bad = {k: np.full_like(v, np.inf) for k, v in _deltas(1)[0].items()}
    assert first.accept(_device_update(bad), ctx)
    empty = from_shareable(first.aggregate(ctx)).data
    assert empty["count"] == 0 and empty["rejected"] == 1 and not any(v.any() for v in empty["dict"].values())
    for delta in _deltas(2):
        second.accept(_device_update(delta), ctx)
    server = ScreenedUpdateAggregator()
    for leaf_sum in (DXO(DataKind.WEIGHT_DIFF, empty).to_shareable(), second.aggregate(ctx)):
        assert server.accept(leaf_sum, ctx)
    assert server.count == 2 and server.rejected == 1
    stock = ModelUpdateDXOAggregator()  # NVFlare's own manager (--payloads lists) takes a leaf's zeros too
    assert stock.accept(DXO(DataKind.WEIGHT_DIFF, dict(empty)).to_shareable(), ctx) and stock.count == 0
    nothing = ScreenedUpdateAggregator()
    assert from_shareable(nothing.aggregate(ctx)).data == {"dict": None, "count": 0, "rejected": 0}
    assert server.accept(nothing.aggregate(ctx), ctx) and server.count == 2


def test_list_payloads_are_checked_as_float32_arrays():
    leaf = ScreenedUpdateAggrFactory(SETTINGS).get_aggregator()
    delta = _deltas(1)[0]
    assert leaf.accept(_device_update({k: v.tolist() for k, v in delta.items()}), FLContext())
    assert leaf.count == 1 and leaf.rejected == 0


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_update_norm", 0.0, "--max-update-norm must be a finite number > 0"),
        ("update_norm_factor", 1.0, "--update-norm-factor must be a finite number > 1"),
    ],
)
def test_bad_screen_settings_are_refused_by_the_recipe(field, value, message):
    with pytest.raises(ValueError, match=message):
        DevsimEdgeRecipe(
            settings=SETTINGS,
            num_leaf_nodes=1,
            devices_per_leaf=2,
            num_versions=1,
            ship_packages=False,
            **{field: value},
        )


def test_an_edge_run_whose_updates_are_all_nan_keeps_a_finite_model_and_says_so(tmp_path):
    """``--lr 1e30``: every device's update is NaN. The leaves leave them all out, so the global model stays the
    initial one (before, the first version was NaN), and the command's last line and the results count them."""
    from tests.test_edge import EDGE_RUN, _run_edge_job

    output = tmp_path / "out"
    args = [*EDGE_RUN, "--num-versions", "2", "--lr", "1e30", "--workspace", str(tmp_path / "ws")]
    proc = _run_edge_job([*args, "--output-dir", str(output)], tmp_path, 240)
    records = json.loads((output / "edge_results.json").read_text())["records"]
    assert all(np.isfinite(r["loss"]) and r["loss"] == records[0]["loss"] for r in records), records
    assert records[-1]["rejected_updates"] >= 16, records
    assert f"{records[-1]['rejected_updates']} device updates rejected by the leaves" in proc.stdout.splitlines()[-1]
    assert "rejected (non_finite)" in proc.stdout


def test_a_leaf_sum_is_the_same_in_any_order_devices_finish_in():
    """Device updates are summed in float64: the threads' finishing order (and where a leaf's report cuts a version's
    updates) no longer changes the global model, so a FedAvg-mode edge run repeats bit for bit."""
    deltas = _deltas(12, scale=0.05)
    sums = []
    for order in (range(12), reversed(range(12)), [5, 0, 11, 3, 7, 1, 9, 2, 10, 4, 8, 6]):
        first, second = (ScreenedUpdateAggrFactory(SETTINGS).get_aggregator() for _ in range(2))
        order = list(order)
        for i in order[:5]:
            first.accept(_device_update(deltas[i], i), FLContext())
        for i in order[5:]:
            second.accept(_device_update(deltas[i], i), FLContext())
        server = ScreenedUpdateAggregator()
        for leaf in (second, first) if order[0] == 5 else (first, second):
            server.accept(leaf.aggregate(FLContext()), FLContext())
        sums.append(server.dict)
    for key in sums[0]:
        assert sums[0][key].dtype == np.float64
        assert all(np.array_equal(sums[0][key], other[key]) for other in sums[1:]), key
