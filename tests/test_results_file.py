"""results.json: each record encoded once, the file byte for byte what json.dump(data, indent=1) writes."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from devsim.observe.results import RunRecorder, load_results

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=12,
)
records = st.lists(st.dictionaries(st.text(max_size=6), values, max_size=5), max_size=6)


@settings(max_examples=60, deadline=None)
@given(first=records, later=records, resumed=records, extra=values)
def test_the_file_is_what_json_dump_writes_after_appends_a_resume_and_other_keys(
    tmp_path_factory, first, later, resumed, extra
):
    recorder = RunRecorder(str(tmp_path_factory.mktemp("run")), {"seed": 0}, "fedavg")
    assert recorder.text() == json.dumps(recorder.data, indent=1)  # no rounds yet
    for record in first:
        recorder.add_round(record)
    recorder.data["startup"] = extra
    for record in later:
        recorder.data["rounds"].append(record)  # appended without add_round: picked up by the next flush
    assert recorder.text() == json.dumps(recorder.data, indent=1)
    recorder.data["rounds"] = list(resumed)  # a resume replaces the list
    recorder.finish({"final_accuracy": 0.5})
    assert load_results(recorder.output_dir) == json.loads(json.dumps(recorder.data))
    assert open(recorder.path, encoding="utf-8").read() == json.dumps(recorder.data, indent=1)


def test_records_are_written_at_once_while_rewrites_are_cheap_and_all_of_them_at_the_end(tmp_path, monkeypatch):
    """A rewrite that took 1 s is not repeated until 1 / FLUSH_SHARE s have passed (50 s); the records added
    meanwhile come with the next rewrite, and finish() writes everything."""
    import devsim.observe.results as results

    clock = {"now": 0.0}
    monkeypatch.setattr(results.time, "perf_counter", lambda: clock["now"])
    recorder = RunRecorder(str(tmp_path), {}, "fedavg")
    written = lambda: len(load_results(str(tmp_path))["rounds"])  # noqa: E731
    real_text = recorder.text

    def slow_text():  # each rewrite takes 1 s of the fake clock
        clock["now"] += 1.0
        return real_text()

    recorder.add_round({"round": 1})
    assert written() == 1  # the first record is always written
    monkeypatch.setattr(recorder, "text", slow_text)
    clock["now"] += 0.5
    recorder.add_round({"round": 2})  # the last rewrite took 0 s: written
    assert written() == 2
    for round_num in range(3, 8):
        clock["now"] += 1.0
        recorder.add_round({"round": round_num})
    assert written() == 2  # 5 s since a 1 s rewrite: not yet
    clock["now"] += 1.0 / results.FLUSH_SHARE - 5.0
    recorder.add_round({"round": 8})
    assert written() == 8
    recorder.add_round({"round": 9})
    recorder.finish({"final_accuracy": 0.5})
    assert [r["round"] for r in load_results(str(tmp_path))["rounds"]] == list(range(1, 10))
