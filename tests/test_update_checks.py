"""Update validation: malformed, non-finite or oversized updates are rejected, never raised on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from devsim.aggregation.update_checks import CATEGORIES, UpdateRejection, UpdateValidator

REFERENCE = {
    "conv1.weight": np.zeros((4, 3, 3, 3), dtype=np.float32),
    "fc3.weight": np.zeros((10, 8), dtype=np.float32),
    "fc3.bias": np.zeros((10,), dtype=np.float32),
}


def good_delta(scale: float = 0.01, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in REFERENCE.items()}


def with_entry(key: str, value) -> dict:
    delta = good_delta()
    delta[key] = value
    return delta


def assert_rejected(result, category: str, *fragments: str) -> None:
    assert isinstance(result, UpdateRejection), result
    assert result.category == category, result
    for fragment in fragments:
        assert fragment in result.reason, result


def test_good_update_is_accepted():
    validator = UpdateValidator(REFERENCE, max_norm=10.0, max_norm_factor=3.0)
    assert validator.check_delta(good_delta(), "site-1") is None
    assert validator.counts() == dict.fromkeys(CATEGORIES, 0)
    assert validator.median_norm is not None and validator.median_norm > 0


@pytest.mark.parametrize(
    "limits", [{}, {"max_norm": 1e30, "max_norm_factor": 3.0}], ids=["no norm limit", "norm limited"]
)
def test_nan_and_inf_are_counted_and_named(limits):
    """Without a norm limit a finiteness pass finds them; with one, the non-finite sum of squares does."""
    value = np.zeros((4, 3, 3, 3), dtype=np.float32)
    value.flat[:3] = np.nan
    value.flat[5] = np.inf
    result = UpdateValidator(REFERENCE, **limits).check_delta(with_entry("conv1.weight", value), "site-1")
    assert_rejected(result, "non_finite", "conv1.weight", "3 NaN", "1 inf")
    assert result.source == "site-1"


def test_wrong_shape():
    result = UpdateValidator(REFERENCE).check_delta(with_entry("fc3.bias", np.zeros(5, np.float32)), "site-1")
    assert_rejected(result, "shape", "shape (5,) != expected (10,) for fc3.bias")


def test_missing_and_unexpected_keys():
    delta = good_delta()
    del delta["fc3.bias"]
    delta["fc4.bias"] = np.zeros(10, np.float32)
    result = UpdateValidator(REFERENCE).check_delta(delta, "site-2")
    assert_rejected(result, "keys", "missing keys ['fc3.bias']", "unexpected keys ['fc4.bias']")


def test_many_unexpected_keys_are_listed_briefly():
    delta = good_delta() | {f"extra{i}": np.zeros(1, np.float32) for i in range(1000)}
    result = UpdateValidator(REFERENCE).check_delta(delta, "site-2")
    assert_rejected(result, "keys", "'extra0'", "995 more")
    assert len(result.reason) < 300


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int64])
def test_wrong_dtype(dtype):
    result = UpdateValidator(REFERENCE).check_delta(with_entry("fc3.bias", np.zeros(10, dtype)), "site-1")
    assert_rejected(result, "dtype", f"dtype {np.dtype(dtype)} for fc3.bias, expected float32")


@pytest.mark.parametrize(
    "value, type_name",
    [
        ([0.0] * 10, "list"),
        (torch.zeros(10), "torch.Tensor"),
        (np.ma.masked_array(np.zeros(10, np.float32)), "MaskedArray"),
        (None, "NoneType"),
    ],
)
def test_non_array_values(value, type_name):
    result = UpdateValidator(REFERENCE).check_delta(with_entry("fc3.bias", value), "site-1")
    assert_rejected(result, "type", "fc3.bias", type_name)


def test_delta_that_is_not_a_mapping():
    result = UpdateValidator(REFERENCE).check_delta([1, 2, 3], "site-1")
    assert_rejected(result, "type", "list")


def test_absurd_norm_against_absolute_limit():
    validator = UpdateValidator(REFERENCE, max_norm=1e6)
    result = validator.check_delta(good_delta(scale=1e8), "site-1")
    assert_rejected(result, "norm", "exceeds the limit 1.0e+06")
    assert validator.counts()["norm"] == 1


def test_norm_is_per_sample_mean_of_weighted_sum():
    validator = UpdateValidator(REFERENCE, max_norm=1.0)
    weighted_sum = good_delta(scale=0.2)
    norm = np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in weighted_sum.values()))
    assert norm > 1.0
    assert validator.check_delta(weighted_sum, "site-1", weight=norm * 2) is None
    assert_rejected(validator.check_delta(weighted_sum, "site-1", weight=norm / 2), "norm")


def test_float32_extremes_do_not_overflow_the_norm():
    validator = UpdateValidator(REFERENCE, max_norm=1e30)
    delta = with_entry("fc3.bias", np.full(10, 3e38, np.float32))
    assert_rejected(validator.check_delta(delta, "site-1"), "norm", "exceeds the limit")


def test_adaptive_limit_applies_after_five_accepted_updates():
    validator = UpdateValidator(REFERENCE, max_norm_factor=3.0)
    big = good_delta(scale=1.0, seed=99)
    assert validator.check_delta(big, "early") is None
    for i in range(4):
        assert validator.check_delta(good_delta(scale=0.01, seed=i), f"device {i}") is None
    assert validator.check_delta(good_delta(scale=0.02, seed=7), "device 7") is None
    result = validator.check_delta(big, "device 8")
    assert_rejected(result, "norm", "exceeds the limit", "(3 x ")
    assert validator.check_delta(good_delta(scale=0.025, seed=8), "device 9") is None


def test_adaptive_and_absolute_limits_take_the_smaller():
    validator = UpdateValidator(REFERENCE, max_norm=1e-6, max_norm_factor=3.0)
    assert_rejected(validator.check_delta(good_delta(), "site-1"), "norm", "1.0e-06")


@pytest.mark.parametrize("weight", [0.0, -3.0, float("nan"), float("inf"), "12", None, True])
def test_bad_total_weight(weight):
    payload = {"delta_sum": good_delta(), "total_weight": weight}
    result = UpdateValidator(REFERENCE).check_leaf_payload(payload, "site-1")
    assert_rejected(result, "weight", "total_weight")


def test_leaf_payload_checks_mean_delta():
    validator = UpdateValidator(REFERENCE, max_norm=1.0)
    payload = {"delta_sum": good_delta(scale=0.5), "total_weight": 1000.0, "device_metrics": {}}
    assert validator.check_leaf_payload(payload, "site-1") is None
    payload["total_weight"] = 1.0
    assert_rejected(validator.check_leaf_payload(payload, "site-1"), "norm")
    assert_rejected(validator.check_leaf_payload({"total_weight": 1.0}, "site-1"), "type", "delta_sum")
    assert_rejected(validator.check_leaf_payload({"delta_sum": good_delta()}, "site-1"), "weight", "total_weight")
    assert_rejected(validator.check_leaf_payload("junk", "site-1"), "type", "str")


def test_job_result():
    validator = UpdateValidator(REFERENCE, max_norm=10.0)
    stacked = {k: np.stack([v, v]) for k, v in good_delta().items()}
    job_delta = {k: v[1] for k, v in stacked.items()}
    assert validator.check_job_result(job_delta, np.int64(100), "device 17") is None
    assert_rejected(validator.check_job_result(job_delta, 0, "device 17"), "weight", "num_samples")
    result = validator.check_job_result(with_entry("fc3.bias", np.full(10, np.nan, np.float32)), 100, "device 17")
    assert_rejected(result, "non_finite", "fc3.bias", "10 NaN")
    assert result.source == "device 17"


def test_counts_by_category():
    validator = UpdateValidator(REFERENCE)
    validator.check_delta(with_entry("fc3.bias", [1.0]), "a")
    validator.check_delta(with_entry("fc3.bias", np.zeros(3, np.float32)), "b")
    validator.check_delta(with_entry("fc3.bias", np.zeros(3, np.float32)), "c")
    counts = validator.counts()
    assert counts["type"] == 1 and counts["shape"] == 2
    assert set(counts) == set(CATEGORIES)


class _Hostile(dict):
    def __getitem__(self, key):
        raise RuntimeError("boom")


def test_exceptions_inside_checks_become_rejections():
    hostile = _Hostile(good_delta())
    result = UpdateValidator(REFERENCE).check_delta(hostile, "site-1")
    assert_rejected(result, "error", "RuntimeError", "boom")


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="max_norm"):
        UpdateValidator(REFERENCE, max_norm=0.0)
    with pytest.raises(ValueError, match="max_norm_factor"):
        UpdateValidator(REFERENCE, max_norm_factor=1.0)
    with pytest.raises(ValueError, match="reference"):
        UpdateValidator({})


_KEYS = [*REFERENCE, "fc4.bias", ""]
_ARRAYS = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.float16, np.int64, np.bool_, np.complex64, np.uint8]),
    shape=st.one_of(st.sampled_from([v.shape for v in REFERENCE.values()]), hnp.array_shapes(min_dims=0, max_dims=3)),
)
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10), st.binary(max_size=10), _ARRAYS
)
_JUNK = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(_KEYS), st.text(max_size=5), st.integers()), inner, max_size=5),
    ),
    max_leaves=12,
)


def _check_result(result) -> None:
    assert result is None or isinstance(result, UpdateRejection)
    if result is not None:
        assert result.category in CATEGORIES and result.reason


@settings(max_examples=300, deadline=None)
@given(junk=_JUNK, weight=_SCALARS)
def test_arbitrary_junk_never_raises(junk, weight):
    validator = UpdateValidator(REFERENCE, max_norm=1e3, max_norm_factor=2.0)
    _check_result(validator.check_delta(junk, "junk", weight=weight))
    _check_result(validator.check_leaf_payload(junk, "junk"))
    _check_result(validator.check_leaf_payload({"delta_sum": junk, "total_weight": weight}, "junk"))
    _check_result(validator.check_job_result(junk, weight, "junk"))
    assert sum(validator.counts().values()) <= 4


@settings(max_examples=100, deadline=None)
@given(entries=st.fixed_dictionaries({k: _ARRAYS for k in REFERENCE}))
def test_arbitrary_arrays_under_the_right_keys_never_raise(entries):
    _check_result(UpdateValidator(REFERENCE, max_norm=1e3).check_delta(entries, "junk"))


def _reply(scale: float, seed: int = 0) -> dict:
    return {"delta_sum": good_delta(scale=scale, seed=seed), "total_weight": 1.0, "device_metrics": {}}


def _validator_after_small_updates(factor: float = 20.0) -> UpdateValidator:
    """A validator that has accepted ten updates of norm about 0.01 x sqrt(entries)."""
    validator = UpdateValidator(REFERENCE, max_norm_factor=factor)
    for seed in range(10):
        assert validator.check_delta(good_delta(scale=0.01, seed=seed), f"device {seed}") is None
    return validator


def test_a_round_whose_leaves_all_grew_together_is_accepted():
    """Leaving a plateau, every leaf's update grows 25-60x in a few rounds: the round's lower median raises the
    adaptive limit, and the remembered median then follows. A lone reply is still judged by the history alone."""
    validator = _validator_after_small_updates()
    results = validator.check_round({"site-1": _reply(0.5, 1), "site-2": _reply(0.6, 2)})
    assert results == {"site-1": None, "site-2": None}
    lone = _validator_after_small_updates()
    assert_rejected(lone.check_round({"site-1": _reply(0.5, 1)})["site-1"], "norm", "20 x median")
    assert_rejected(lone.check_leaf_payload(_reply(0.5, 1), "site-1"), "norm", "of the last 10 accepted")


@pytest.mark.parametrize("honest, faulty", [(1, 1), (2, 2), (3, 1)], ids=["1 of 2", "2 of 4", "1 of 4"])
def test_faulty_replies_are_rejected_while_at_most_half_of_a_round(honest, faulty):
    """The lower median is an honest norm while at most half the replies are faulty: faulty replies 1e4x the honest
    ones (which are themselves 50x the history) are rejected, the honest accepted."""
    validator = _validator_after_small_updates()
    replies = {f"honest-{i}": _reply(0.5, i) for i in range(honest)}
    replies.update({f"faulty-{i}": _reply(5e3, 10 + i) for i in range(faulty)})
    results = validator.check_round(replies)
    for source, result in results.items():
        if source.startswith("honest"):
            assert result is None, result
        else:
            assert_rejected(result, "norm", "the lower median of this round's")


def test_a_malformed_reply_does_not_count_towards_the_round_median_and_limits_are_per_leaf():
    """Only replies that pass every other check enter the round's median; ``max_norms`` sets a leaf's absolute
    limit (the cluster job's leaves train different models)."""
    validator = _validator_after_small_updates()
    broken = {"delta_sum": good_delta(scale=0.5), "total_weight": 0.0}
    results = validator.check_round({"site-1": _reply(0.5, 1), "site-2": broken})
    assert_rejected(results["site-1"], "norm", "20 x median")
    assert_rejected(results["site-2"], "weight", "total_weight")
    limited = validator.check_round({"site-1": _reply(0.01, 1), "site-2": _reply(0.01, 2)}, {"site-2": 1e-6})
    assert limited["site-1"] is None
    assert_rejected(limited["site-2"], "norm", "exceeds the limit 1.0e-06")


def _job_validator_after_small_updates(count: int = 20) -> UpdateValidator:
    validator = UpdateValidator(REFERENCE, max_norm_factor=20.0)
    for seed in range(count):
        assert validator.check_job_result(good_delta(scale=0.01, seed=seed), 100, f"device {seed}") is None
    return validator


def test_jobs_that_all_grew_together_are_accepted_after_half_a_history():
    """Asynchronous jobs come one at a time: when every device's update grows 50x at once, the first are rejected
    by the remembered median, and once most of the last :data:`NORM_HISTORY` checked norms are the new scale their
    lower median lets the rest through, where a median of accepted updates alone rejected every one from then on
    (the run could never reach a new version)."""
    validator = _job_validator_after_small_updates()
    verdicts = [validator.check_job_result(good_delta(scale=0.5, seed=100 + i), 100, f"device {i}") for i in range(80)]
    rejected = [i for i, verdict in enumerate(verdicts) if verdict is not None]
    assert rejected == list(range(len(rejected))) and 10 <= len(rejected) <= 25, rejected
    assert_rejected(verdicts[0], "norm", "20 x median", "of the last 20 accepted")
    assert validator.median_norm > 10 * _job_validator_after_small_updates().median_norm


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.45])
def test_faulty_jobs_are_rejected_while_fewer_than_half_of_the_last_checked(fraction):
    """Faulty jobs 1e4x the honest norm, interleaved at up to 45% of the jobs, never enter: the candidates' lower
    median stays an honest norm."""
    validator = _job_validator_after_small_updates()
    rng = np.random.default_rng(3)
    for i in range(400):
        faulty = rng.random() < fraction
        verdict = validator.check_job_result(good_delta(scale=100.0 if faulty else 0.01, seed=i), 100, f"device {i}")
        if faulty:
            assert_rejected(verdict, "norm", "exceeds the limit")
        else:
            assert verdict is None, verdict
