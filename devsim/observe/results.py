"""A run's results file: the configuration, one record per round, and the final summary.

``results.json`` is rewritten atomically after a round so that a crashed or interrupted run still leaves a readable
file. Records are about 2 KB each; each is encoded once (the first flush after it was added) and later flushes join
the encoded text, so a flush costs writing the file, not encoding every round again: with Python's indenting JSON
encoder, re-encoding 1,000 records took about 0.1 s a round on this 2-core CPU. The file is byte for byte what
``json.dump(data, indent=1)`` writes.

Writing the whole file still grows with the run (3,000 records: 18 ms), so a round's record is written at once
only while rewrites are cheap: :data:`FLUSH_SHARE` bounds the share of the run's time spent on them (2%; at 10% the
rewrites took 1.2 ms of a 15 ms round of the 2-core CPU's fastest FedAvg, 8% of its rounds' time). A run of
rounds that take 50 times a rewrite or longer writes after every round; faster or longer runs write every few
rounds, and a crash then loses at most the records of the last 1 / ``FLUSH_SHARE`` rewrite times (3,000 records:
0.9 s). The summary and a stop are written at once.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from typing import Any

FLUSH_SHARE = 0.02
"""Most of a run's time :meth:`RunRecorder.add_round` spends rewriting ``results.json``: a record is written at once
when the time since the last rewrite is at least the last rewrite's duration / ``FLUSH_SHARE``."""


RECORDS_LOG = "records.jsonl"
"""The append-only log of a run's records in its folder, which a checkpoint names (:meth:`RunRecorder.log_records`)."""


def _log_line(record: dict[str, Any]) -> str:
    """One record as a line of ``records.jsonl`` (JSON escapes newlines inside strings, so a record is one line)."""
    return json.dumps(record, separators=(",", ":")) + "\n"


def _write_replacing(path: str, chunks: Iterable[str]) -> None:
    """Write ``chunks`` to ``path`` atomically: a temporary file beside it, then a rename."""
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as stream:
        stream.writelines(chunks)
    os.replace(tmp, path)


def read_logged_records(folder: str, mark: dict[str, Any]) -> list[dict[str, Any]]:
    """The first ``mark["count"]`` records of ``<folder>/<mark["file"]>`` (a mark from
    :meth:`RunRecorder.log_records`); lines after them (records of rounds after the checkpoint) are left unread.
    FileNotFoundError or ValueError names the file when it holds fewer records than the mark counts."""
    path = os.path.join(folder, os.path.basename(mark["file"]))
    count = int(mark["count"])
    records: list[dict[str, Any]] = []
    if count:
        with open(path, encoding="utf-8") as stream:
            for line in stream:
                records.append(json.loads(line))
                if len(records) == count:
                    break
    if len(records) < count:
        raise ValueError(f"{path} holds {len(records)} records; the checkpoint beside it counts {count}")
    return records


class RunRecorder:
    """Collects per-round records and writes ``<output_dir>/results.json`` (with ``task``: what the run trained,
    see :meth:`devsim.tasks.Task.record`)."""

    def __init__(self, output_dir: str, config: dict[str, Any], method: str, task: dict[str, Any] | None = None):
        self.output_dir = output_dir
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, "results.json")
        self.data: dict[str, Any] = {"method": method, "config": config, "rounds": [], "summary": {}}
        if task is not None:
            self.data["task"] = task
        self._encoded: list[str] = []
        """The records of ``_encoded_list`` encoded so far, in order, as they appear in the file."""
        self._encoded_list: list[dict[str, Any]] | None = None
        self._flushed_at = -float("inf")
        self._flush_seconds = 0.0
        self._logged = 0
        """How many records of ``_logged_list`` are in ``records.jsonl``, in order."""
        self._logged_list: list[dict[str, Any]] | None = None

    def add_round(self, record: dict[str, Any]) -> None:
        """Add one round's (or evaluation's) record; written now unless rewrites have become costly (module doc)."""
        self.data["rounds"].append(record)
        if time.perf_counter() - self._flushed_at >= self._flush_seconds / FLUSH_SHARE:
            self.flush()

    def finish(self, summary: dict[str, Any]) -> None:
        self.data["summary"] = summary
        self.flush()

    def flush(self) -> None:
        """Write ``results.json`` atomically (a temporary file, then a rename), every record added so far."""
        started = time.perf_counter()
        _write_replacing(self.path, [self.text()])
        self._flushed_at = time.perf_counter()
        self._flush_seconds = self._flushed_at - started

    def mark_failed(self, reason: str) -> None:
        """Write ``failed: {"reason": reason}`` into ``results.json`` now (the run ended on an error)."""
        self.data["failed"] = {"reason": reason}
        self.flush()

    def log_records(self) -> dict[str, Any]:
        """Append the records not yet logged to ``<output_dir>/records.jsonl`` (one compact JSON record a line) and
        return the mark a checkpoint keeps instead of the records: ``{"file": name, "count": records so far}``.

        A checkpoint then costs the records added since the last one, not every record so far (a checkpoint that
        pickled 3,000 records took 41 ms on this 2-core CPU). A list of records replaced (a resume) or shortened is
        logged anew, through a temporary file and a rename, so the file always starts with every record an earlier
        mark counted. Read back with :func:`read_logged_records`."""
        rounds = self.data["rounds"]
        path = os.path.join(self.output_dir, RECORDS_LOG)
        if rounds is not self._logged_list or len(rounds) < self._logged or not os.path.isfile(path):
            _write_replacing(path, (_log_line(record) for record in rounds))
        elif self._logged < len(rounds):
            with open(path, "a", encoding="utf-8") as stream:
                stream.writelines(_log_line(record) for record in rounds[self._logged :])
        self._logged, self._logged_list = len(rounds), rounds
        return {"file": RECORDS_LOG, "count": len(rounds)}

    def text(self) -> str:
        """``json.dumps(self.data, indent=1)``, with the records encoded before reused. Records are not changed after
        they are added; a list of records replaced (a resume) or shortened is encoded anew."""
        rounds = self.data["rounds"]
        if rounds is not self._encoded_list or len(rounds) < len(self._encoded):
            self._encoded, self._encoded_list = [], rounds
        for record in rounds[len(self._encoded) :]:
            self._encoded.append("  " + json.dumps(record, indent=1).replace("\n", "\n  "))
        marker = f"devsim-rounds-{id(self)}"
        outer = json.dumps({**self.data, "rounds": marker}, indent=1)
        listed = "[\n" + ",\n".join(self._encoded) + "\n ]" if self._encoded else "[]"
        return outer.replace(json.dumps(marker), listed, 1)


def load_results(run_dir: str) -> dict[str, Any]:
    """Read ``results.json`` from a run folder."""
    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as stream:
        return json.load(stream)


def failure_reason(results: dict[str, Any]) -> str | None:
    """Why a run failed, from a ``results.json``'s content (its ``failed`` reason: see
    :meth:`RunRecorder.mark_failed`), or None."""
    failed = results.get("failed")
    return str(failed.get("reason")) if isinstance(failed, dict) and failed.get("reason") else None


def record_step(record: dict[str, Any], index: int) -> float:
    """A ``results.json`` record's position: its global model ``version`` (asynchronous runs) or ``round``; the
    record's 1-based ``index`` for a record with neither."""
    return float(record.get("version", record.get("round", index + 1)))


def record_metric(record: dict[str, Any], metric: str) -> float | None:
    """A round's (or version's) ``metric`` in a ``results.json`` record: ``loss``, ``accuracy`` or a task metric of
    its ``metrics``; None when that record was not evaluated or has no such metric."""
    if metric in ("loss", "accuracy"):
        value = record.get(metric)
    else:
        value = (record.get("metrics") or {}).get(metric)
    return None if value is None else float(value)


def final_metric(summary: dict[str, Any], metric: str) -> float | None:
    """A finished run's final ``metric`` from its ``results.json`` summary (``loss``, ``accuracy`` or a task
    metric); None when the run has none."""
    if metric == "loss":
        value = summary.get("final_loss")
    else:
        value = (summary.get("final_metrics") or {}).get(metric, summary.get(f"final_{metric}"))
    return None if value is None else float(value)
