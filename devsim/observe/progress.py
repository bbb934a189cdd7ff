"""One progress line per round (or per global model version) with elapsed time and an ETA.

The ETA is the remaining step count times an exponential moving average (EMA) of recent step
durations, so it follows a run that speeds up or slows down instead of averaging from the start. A run
that another bound may end first (an asynchronous run's simulated time) passes that bound's ETA
(:class:`BoundEta`) and the line shows the sooner one.
"""

from __future__ import annotations


class ProgressLine:
    """Formats ``round 12/100  elapsed 0:01:23  eta 0:10:05  <extra>`` lines.

    Call ``line`` after every completed step (round or version), even those that do not print,
    so the EMA sees every step. ``unit`` is the word printed ("round", or "version" for async runs).
    ``alpha`` in (0, 1] is the EMA weight of the newest step duration. ``start`` is the number of
    steps already done before timing began (a resumed run); elapsed time counts from then.
    """

    def __init__(self, total_rounds: int, every: int = 1, unit: str = "round", alpha: float = 0.3, start: int = 0):
        if total_rounds < 1:
            raise ValueError(f"total_rounds must be >= 1, got {total_rounds}")
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.total = int(total_rounds)
        self.every = int(every)
        self.unit = unit
        self.alpha = float(alpha)
        self.step_seconds: float | None = None
        self._last_done = int(start)
        self._last_elapsed = 0.0

    def update(self, round_done: int, elapsed_s: float) -> None:
        """Feed the EMA with the steps completed since the last call (``elapsed_s``: seconds since start)."""
        steps = round_done - self._last_done
        if steps <= 0:
            return
        duration = max(0.0, elapsed_s - self._last_elapsed) / steps
        if self.step_seconds is None:
            self.step_seconds = duration
        else:
            weight = 1.0 - (1.0 - self.alpha) ** steps
            self.step_seconds += weight * (duration - self.step_seconds)
        self._last_done = round_done
        self._last_elapsed = elapsed_s

    def eta_seconds(self, round_done: int) -> float | None:
        """Seconds left: remaining steps times the EMA step duration (None before the first step)."""
        if self.step_seconds is None:
            return None
        return max(0, self.total - round_done) * self.step_seconds

    def line(self, round_done: int, elapsed_s: float, extra: str = "", other_eta: float | None = None) -> str | None:
        """The line after ``round_done`` steps (1-based) and ``elapsed_s`` seconds, or None when this
        step does not print (only every ``every``-th step and the last one print). ``other_eta`` (seconds) is
        the ETA of another bound that ends the run (e.g. simulated time, :class:`BoundEta`); the line shows
        the sooner of the two."""
        self.update(round_done, elapsed_s)
        if round_done % self.every != 0 and round_done != self.total:
            return None
        eta = self.eta_seconds(round_done)
        if other_eta is not None:
            eta = other_eta if eta is None else min(eta, other_eta)
        text = (
            f"{self.unit} {round_done}/{self.total}  elapsed {format_duration(elapsed_s)}  "
            f"eta {format_duration(eta) if eta is not None else '-'}"
        )
        return f"{text}  {extra}" if extra else text


class BoundEta:
    """Wall seconds until a quantity that grows during the run (e.g. simulated seconds) reaches ``bound``: the
    amount left over an EMA of its growth per wall second (``alpha`` as in :class:`ProgressLine`). ``value``
    is where the quantity stands ``elapsed_s`` wall seconds into the run when timing begins (a resumed run
    starts from its checkpoint's value)."""

    def __init__(self, bound: float, value: float = 0.0, elapsed_s: float = 0.0, alpha: float = 0.3):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.bound = float(bound)
        self.alpha = float(alpha)
        self.rate: float | None = None  # quantity per wall second
        self._last = (float(value), float(elapsed_s))

    def update(self, value: float, elapsed_s: float) -> float | None:
        """Feed ``value`` reached after ``elapsed_s`` wall seconds; the ETA in seconds (None until it grew)."""
        if elapsed_s > self._last[1] and value > self._last[0]:  # a stall stays inside the next interval
            rate = (value - self._last[0]) / (elapsed_s - self._last[1])
            self.rate = rate if self.rate is None else self.rate + self.alpha * (rate - self.rate)
            self._last = (value, elapsed_s)
        if self.rate is None:
            return None
        return max(0.0, self.bound - value) / self.rate


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` for a duration in seconds (rounded to whole seconds; hours may exceed 24)."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def format_metrics(loss: float, metrics: dict[str, float]) -> str:
    """``accuracy 0.9583  loss 0.1268  <other metrics>``: an evaluation's loss and the task's metrics, accuracy
    first when there is one, then the loss, then the other metrics in their order; 4 decimals each."""
    parts = [f"accuracy {float(metrics['accuracy']):.4f}"] if "accuracy" in metrics else []
    parts.append(f"loss {float(loss):.4f}")
    parts += [f"{name} {float(value):.4f}" for name, value in metrics.items() if name != "accuracy"]
    return "  ".join(parts)
