"""Privacy accounting with Google's ``dp-accounting`` (RDP and PLD): one event per applied aggregate.

Every round of a run releases the same mechanism (same sampling, same noise multiplier), so the accountant is fed
the run's one :class:`~dp_accounting.DpEvent` once per round and reports epsilon at the run's delta after each.
Its state is the number of events composed (an int: it goes into the checkpoint, and a resumed run recomposes that
many). Per round it costs microseconds with RDP (the event's RDP vector is computed once by the library and the
library converts ``rounds * rdp`` to epsilon) and one PLD convolution with PLD (tens of milliseconds).
"""

from __future__ import annotations

import contextlib
import logging

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

SMALLEST_NOISE = 0.1
"""The smallest noise multiplier :func:`solve_noise_multiplier` returns (a target reached with less gets this)."""
PLD_SEARCH_FLOOR = 0.7
"""PLD's noise multiplier is searched down to this fraction of RDP's."""
PLD_DISCRETIZATION = 1e-4
"""Value discretization interval of the PLD (``dp-accounting``'s default)."""


class _SkippedOrders(logging.Filter):
    """Drops RDP's "failed to converge ... Excluding this order" warnings: the library leaves such an order out of
    the epsilon (a valid, slightly looser bound) and says so once per order and composition, flooding the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Excluding this order" not in record.getMessage()


@contextlib.contextmanager
def _quiet_orders():
    loggers, skipped = (logging.getLogger(), logging.getLogger("absl")), _SkippedOrders()
    for logger in loggers:
        logger.addFilter(skipped)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(skipped)


def relation(replace_one: bool) -> dp_accounting.NeighboringRelation:
    """The neighbouring relation of the accounting: replace one device (fixed-size sampling) or add/remove one."""
    return (
        dp_accounting.NeighboringRelation.REPLACE_ONE
        if replace_one
        else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )


def epsilon_after(
    event: dp_accounting.DpEvent, rounds: int, delta: float, kind: str = "rdp", replace_one: bool = False
) -> float:
    """Epsilon at ``delta`` after ``rounds`` compositions of ``event``, from a fresh library accountant."""
    if kind == "pld":
        accountant = dp_accounting.pld.PLDAccountant(relation(replace_one), PLD_DISCRETIZATION)
    else:
        accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation(replace_one))
    with _quiet_orders():
        if rounds:
            accountant.compose(event, int(rounds))
        return float(accountant.get_epsilon(delta))


class RunAccountant:
    """Epsilon of a run after each of its rounds, for one repeated ``event``.

    ``kind`` is "rdp" or "pld" (PLD supports Poisson-sampled and plain Gaussian events). ``replace_one`` picks the
    replace-one relation (fixed-size sampling without replacement); otherwise add/remove one device.
    """

    def __init__(self, event: dp_accounting.DpEvent, delta: float, kind: str = "rdp", replace_one: bool = False):
        if kind not in ("rdp", "pld"):
            raise ValueError(f"accountant must be 'rdp' or 'pld', got {kind!r}")
        self.event, self.delta, self.kind, self.replace_one = event, float(delta), kind, bool(replace_one)
        self.rounds = 0
        if kind == "rdp":
            self._orders, self._unit_rdp = _unit_rdp(event, bool(replace_one))
        else:
            self._unit_pld = _event_pld(event, relation(replace_one))
            self._pld = None
            self._next_pld: tuple[int, privacy_loss_distribution.PrivacyLossDistribution] | None = None
            """The PLD one round ahead, kept from ``--dp-budget``'s look-ahead for :meth:`step` (a compose took
            20-30 ms per round at 1,000 rounds)."""

    def epsilon_at(self, rounds: int) -> float:
        """Epsilon after ``rounds`` events (RDP: any count at once; PLD: the next round or the current one)."""
        if rounds == 0:
            return 0.0
        if self.kind == "rdp":
            return float(rdp_privacy_accountant.compute_epsilon(self._orders, rounds * self._unit_rdp, self.delta)[0])
        return float(self._pld_after(rounds).get_epsilon_for_delta(self.delta))

    def step(self) -> float:
        """Compose one more event (a round was applied); returns epsilon after it."""
        if self.kind == "pld":
            self._pld = self._pld_after(self.rounds + 1)
        self.rounds += 1
        return self.epsilon_at(self.rounds)

    @property
    def epsilon(self) -> float:
        """Epsilon after the rounds composed so far."""
        return self.epsilon_at(self.rounds)

    def state(self) -> dict:
        """What a checkpoint keeps: the number of events composed."""
        return {"rounds": self.rounds}

    def load_state(self, state: dict) -> None:
        """Restore :meth:`state` (``--resume``)."""
        self.rounds = int(state["rounds"])
        if self.kind == "pld":
            self._pld = self._unit_pld.self_compose(self.rounds) if self.rounds else None
            self._next_pld = None

    def _pld_after(self, rounds: int) -> privacy_loss_distribution.PrivacyLossDistribution:
        if rounds == self.rounds and self._pld is not None:
            return self._pld
        if rounds == self.rounds + 1:
            if self._next_pld is None or self._next_pld[0] != rounds:
                self._next_pld = (rounds, self._unit_pld if self._pld is None else self._pld.compose(self._unit_pld))
            return self._next_pld[1]
        return self._unit_pld.self_compose(rounds)


_UNIT_RDP: dict[tuple, tuple] = {}
UNIT_RDP_CACHE = 16
"""Events whose RDP vector is kept (sampling without replacement takes about a second to compute)."""


def _unit_rdp(event: dp_accounting.DpEvent, replace_one: bool) -> tuple:
    """The library's orders and one ``event``'s RDP at each (dp-accounting 0.6.0), computed once per event."""
    key = (event, replace_one)
    if key not in _UNIT_RDP:
        unit = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation(replace_one))
        with _quiet_orders():
            unit.compose(event)
        if len(_UNIT_RDP) >= UNIT_RDP_CACHE:
            _UNIT_RDP.pop(next(iter(_UNIT_RDP)))
        _UNIT_RDP[key] = (unit._orders, unit._rdp.copy())
    orders, rdp = _UNIT_RDP[key]
    return orders, rdp.copy()


def _event_pld(
    event: dp_accounting.DpEvent, neighbouring: dp_accounting.NeighboringRelation
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of one Gaussian or Poisson-sampled Gaussian event, built as ``PLDAccountant`` builds it."""
    sampling = 1.0
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        sampling, event = event.sampling_probability, event.event
    if not isinstance(event, dp_accounting.GaussianDpEvent):
        raise ValueError(f"the PLD accountant here takes Gaussian and Poisson-sampled Gaussian events, not {event}")
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=event.noise_multiplier,
        value_discretization_interval=PLD_DISCRETIZATION,
        sampling_prob=sampling,
        neighboring_relation=neighbouring,
    )


def solve_noise_multiplier(
    make_event, target_epsilon: float, rounds: int, delta: float, kind: str, replace_one: bool, upper: float
) -> float | None:
    """The smallest noise multiplier z (to 1e-4) whose ``make_event(z)`` composed ``rounds`` times stays within
    ``target_epsilon`` at ``delta``, searched in [:data:`SMALLEST_NOISE`, ``upper``]; None when even ``upper`` is
    not enough. PLD is searched between :data:`PLD_SEARCH_FLOOR` times RDP's answer and RDP's answer (PLD is the
    tighter bound, and its cost grows steeply as the noise shrinks)."""
    z_rdp = _calibrate(make_event, target_epsilon, rounds, delta, "rdp", replace_one, SMALLEST_NOISE, upper)
    if kind == "rdp" or z_rdp is None or z_rdp == SMALLEST_NOISE:
        return z_rdp
    return _calibrate(make_event, target_epsilon, rounds, delta, "pld", replace_one, PLD_SEARCH_FLOOR * z_rdp, z_rdp)


def _calibrate(
    make_event, target: float, rounds: int, delta: float, kind: str, replace_one: bool, lower: float, upper: float
) -> float | None:
    """:func:`dp_accounting.calibrate_dp_mechanism` over [lower, upper]: ``lower`` when it already meets the
    target, None when ``upper`` does not."""

    def fresh():
        if kind == "pld":
            return dp_accounting.pld.PLDAccountant(relation(replace_one), PLD_DISCRETIZATION)
        return dp_accounting.rdp.RdpAccountant(neighboring_relation=relation(replace_one))

    if epsilon_after(make_event(upper), rounds, delta, kind, replace_one) > target:
        return None
    if epsilon_after(make_event(lower), rounds, delta, kind, replace_one) <= target:
        return lower
    with _quiet_orders():
        return float(
            dp_accounting.calibrate_dp_mechanism(
                fresh,
                lambda z: dp_accounting.SelfComposedDpEvent(make_event(z), rounds),
                target,
                delta,
                dp_accounting.mechanism_calibration.ExplicitBracketInterval(lower, upper),
                tol=1e-4,
            )
        )
