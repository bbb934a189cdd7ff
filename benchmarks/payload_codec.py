"""Encode + decode time and wire size of a model delta: NumPy arrays vs Python lists, side by side.

A delta is a dict of float32 arrays with a real model's floating-point state shapes (random values) at three sizes:
the small CNN (62k params), a ~1M-parameter CNN defined here, and ResNet-18 (~11M). Methods: ``fobs numpy``
(NVFlare's serializer with its NumPy decomposers), ``fobs numpy*`` (the same with the previous result kept alive, so
the allocator reuses warm memory), ``fobs lists`` and ``json lists`` (the weights as Python lists; decode includes
turning them back into arrays), ``codec convert`` (``model_to_numpy`` / ``numpy_to_tensors``, bytes = ``nbytes``)
and ``codec + fobs`` (the full path a payload takes). Each figure is the median of ``--repeats`` runs after 3
warm-ups (``--list-repeats`` after 1 for the slow list rows), in milliseconds; the table ends with the ratios lists /
``fobs numpy``. ``--json`` writes the rows and the published figure (the ~1M size's ``fobs lists`` / ``fobs numpy``
encode time and bytes) to ``benchmarks/results/payload_codec-<date>.json``:

    .venv/bin/python benchmarks/payload_codec.py --json
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, arguments, print_table  # noqa: E402
from devsim.codec import float_state_keys, model_to_numpy, numpy_to_tensors  # noqa: E402
from devsim.models import build_model  # noqa: E402


class MidConvNet(nn.Module):
    """~1.0M-parameter CNN for 32x32x3 inputs: three conv+pool stages and a 2048 -> 448 -> 10 head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        stages = ((3, 32), (32, 64), (64, 128))
        self.features = nn.Sequential(
            *(layer for i, o in stages for layer in (nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)))
        )
        self.fc1 = nn.Linear(128 * 4 * 4, 448)
        self.fc2 = nn.Linear(448, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.features(x).flatten(1))))


def make_model(name: str) -> nn.Module:
    return MidConvNet() if name == "mid" else build_model(name)


def make_delta(model: nn.Module, seed: int) -> dict[str, np.ndarray]:
    """Random float32 delta with the shapes of the model's floating-point state entries."""
    rng = np.random.default_rng(seed)
    state = model.state_dict()
    return {k: (rng.standard_normal(tuple(state[k].shape)) * 1e-3).astype(np.float32) for k in float_state_keys(model)}


def timed(fn, repeats: int, warmup: int, keep: bool = False):
    """(median seconds, last result) over ``repeats`` calls after ``warmup`` untimed calls.

    GC is collected before and paused during each timed call. The previous call's result is freed
    before the next call unless ``keep``: freed, its buffers go back to the OS and the next call
    page-faults fresh ones; kept, the allocator has warm memory at hand.
    """
    times, result = [], None
    for _ in range(warmup):
        result = fn()
    for _ in range(repeats):
        if not keep:
            result = None
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - started)
        finally:
            gc.enable()
    return statistics.median(times), result


def to_arrays(lists: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) for k, v in lists.items()}


def bench_size(name: str, repeats: int, list_repeats: int, fobs) -> tuple[int, list[tuple[str, float, float, int]]]:
    model = make_model(name)
    delta = make_delta(model, seed=0)
    keys = float_state_keys(model)
    params = sum(v.size for v in delta.values())
    cpu = torch.device("cpu")
    rows = []
    fast = {"repeats": repeats, "warmup": 3}
    slow = {"repeats": list_repeats, "warmup": 1}

    enc, blob = timed(lambda: fobs.dumps(delta), **fast)
    dec, back = timed(lambda: fobs.loads(blob), **fast)
    assert all(np.array_equal(back[k], delta[k]) for k in delta)
    rows.append(("fobs numpy", enc, dec, len(blob)))
    enc, _ = timed(lambda: fobs.dumps(delta), **fast, keep=True)
    dec, _ = timed(lambda: fobs.loads(blob), **fast, keep=True)
    rows.append(("fobs numpy*", enc, dec, len(blob)))

    enc, blob = timed(lambda: fobs.dumps({k: v.tolist() for k, v in delta.items()}), **slow)
    dec, back = timed(lambda: to_arrays(fobs.loads(blob)), **slow)
    assert all(np.array_equal(back[k], delta[k]) for k in delta)
    rows.append(("fobs lists", enc, dec, len(blob)))

    enc, blob = timed(lambda: json.dumps({k: v.tolist() for k, v in delta.items()}).encode("utf-8"), **slow)
    dec, back = timed(lambda: to_arrays(json.loads(blob)), **slow)
    assert all(np.array_equal(back[k], delta[k]) for k in delta)
    rows.append(("json lists", enc, dec, len(blob)))
    del blob, back

    enc, arrays = timed(lambda: model_to_numpy(model), **fast)
    dec, _ = timed(lambda: numpy_to_tensors(arrays, keys, cpu), **fast)
    rows.append(("codec convert", enc, dec, sum(a.nbytes for a in arrays.values())))

    enc, blob = timed(lambda: fobs.dumps(model_to_numpy(model)), **fast)
    dec, _ = timed(lambda: numpy_to_tensors(fobs.loads(blob), keys, cpu), **fast)
    rows.append(("codec + fobs", enc, dec, len(blob)))
    return params, rows


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per NumPy figure (after 3 warm-ups)")
    parser.add_argument("--list-repeats", type=int, default=3, help="timed runs per list figure (after 1 warm-up)")
    parser.add_argument("--sizes", default="cnn,mid,resnet18", help="comma list of cnn, mid (~1M), resnet18")
    args = parser.parse_args()
    session = Session("payload_codec")

    from nvflare.app_common.decomposers import numpy_decomposers
    from nvflare.fuel.utils import fobs

    numpy_decomposers.register()
    torch.set_num_threads(1)

    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; torch threads 1; "
        f"median of {args.repeats} runs after 3 warm-ups "
        f"(NumPy/codec rows), {args.list_repeats} runs after 1 warm-up (list rows)"
    )
    table, ratios, measured = [], [], []
    for name in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        params, rows = bench_size(name, args.repeats, args.list_repeats, fobs)
        measured.append({"size": name, "params": int(params), "rows": rows})
        table += [
            [f"{params:,}", method, f"{enc * 1e3:.2f}", f"{dec * 1e3:.2f}", f"{size:,}"]
            for method, enc, dec, size in rows
        ]
        (_, *cold), (_, *warm) = rows[0], rows[1]
        for method, enc, dec, size in rows[2:4]:
            against = [enc / cold[0], dec / cold[1], size / cold[2], enc / warm[0], dec / warm[1]]
            ratios.append([f"{params:,}", method, *(f"{x:.2f}x" for x in against)])
    print_table(["params", "method", "encode ms", "decode ms", "bytes"], table)
    print("* previous result kept alive between runs (warm heap); other rows free it first (see timed())")
    print("\nratio lists / fobs numpy (list rows free their result too) and lists / fobs numpy* (warm heap)")
    print_table(["params", "method", "encode", "decode", "bytes", "enc/warm", "dec/warm"], ratios)
    if args.json:
        columns = ("method", "encode_s", "decode_s", "bytes")
        sizes = [{**m, "rows": [dict(zip(columns, row, strict=True)) for row in m["rows"]]} for m in measured]
        payload = {"settings": vars(args), "sizes": sizes}
        session.write(payload, figures(measured, session))


def figures(measured: list[dict], session: Session) -> list[dict]:
    """fobs on lists against fobs on NumPy arrays (results freed between runs) at the ~1M-parameter size."""
    published = []
    for size in measured:
        if size["size"] != "mid":
            continue
        rows = {row[0]: row for row in size["rows"]}
        numpy, lists = rows["fobs numpy"], rows["fobs lists"]
        published.append(
            session.figure(
                f"payload encode: fobs on lists vs NumPy, {size['params'] / 1e6:.1f}M params",
                f"{lists[1] / numpy[1]:.0f}x slower encode, {lists[3] / numpy[3]:.2f}x bytes",
                "NumPy on the wire",
            )
        )
    return published


if __name__ == "__main__":
    main()
