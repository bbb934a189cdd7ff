"""What a synchronous round leaves in its record: bytes by link, device metrics averaged over the leaves' replies,
dropouts by cause, and the round's progress-line text. Pure functions over the leaves' reply payloads
(``{leaf: {"counts": ..., "device_metrics": ..., "delta_sum": ...}}``) and round records."""

from __future__ import annotations

import numpy as np

from devsim.observe.progress import format_metrics
from devsim.observe.traffic import TrafficCounter, array_bytes
from devsim.population.heterogeneity import SESSION_END


def count_traffic(
    traffic: TrafficCounter, payloads: dict[str, dict], model_bytes: int, called: int, record: dict
) -> None:
    """Bytes of a round from the leaves' replies (before screening: what crossed the wire) into ``record``."""
    traffic.add("server_to_leaf", model_bytes * called)
    evictions, held = 0, 0
    for payload in payloads.values():
        counts = payload.get("counts", {}) if isinstance(payload, dict) else {}
        traffic.add("device_to_leaf", int(counts.get("uplink_bytes", 0)))
        traffic.add("device_to_leaf_float32", int(counts.get("uplink_raw_bytes", 0)))
        trained = int(counts.get("uplink_updates", 0)) + int(counts.get("dropped", 0))
        traffic.add("leaf_to_device", model_bytes * trained)
        if isinstance(payload, dict) and isinstance(payload.get("delta_sum"), dict):
            traffic.add("leaf_to_server", array_bytes(payload["delta_sum"]))
        evictions += int(counts.get("residual_evictions", 0))
        held += int(counts.get("residuals_held", 0))
    record["bytes"] = traffic.drain()
    record["bytes_total"] = dict(traffic.totals)
    record["residual_evictions"] = evictions
    record["residuals_held"] = held


def dropouts_by_cause(records: list[dict]) -> dict[str, int]:
    """Selected devices lost over the run, by cause (record fields summed over rounds)."""
    causes = {"session_end": SESSION_END, "dropped": "dropped", "silent": "silent", "rejected": "rejected_devices"}
    return {cause: int(sum(r.get(key, 0) for r in records)) for cause, key in causes.items()}


def mean_metric(payloads: dict[str, dict], name: str) -> float:
    """Sample-weighted mean of a per-device metric over the replies (NaN without any device)."""
    if not any(len(p["device_metrics"][name]) for p in payloads.values()):
        return float("nan")
    values = [p["device_metrics"][name] for p in payloads.values()]
    weights = [p["device_metrics"]["num_samples"] for p in payloads.values()]
    return float(np.average(np.concatenate(values), weights=np.concatenate(weights)))


def round_summary(record: dict) -> str:
    """The figures of a round line after the progress prefix: accuracy, loss, the task's metrics, seconds."""
    if "loss" in record:
        text = format_metrics(record["loss"], record.get("metrics", {}))
    else:
        text = f"train-loss {record['device_train_loss']:.4f}"
    if "mean_leaf_accuracy" in record:
        text += f"  mean-leaf-accuracy {record['mean_leaf_accuracy']:.4f}"
    if "num_clusters" in record:
        text += f"  clusters {record['num_clusters']}"
    if record.get("cluster_thresholds"):
        text += "  tau " + "/".join(f"{t:.3f}" for t in record["cluster_thresholds"])
    if record.get("pending_rounds"):
        text += f"  pending {record['pending_rounds']}"
    for check in record.get("resplit") or []:
        if check["split"]:
            text += "  re-split " + "|".join(",".join(part) for part in check["parts"])
        elif check["rounds"]:
            text += f"  re-split pending {check['rounds']}"
    if "dp_epsilon" in record:
        text += f"  epsilon {record['dp_epsilon']:.3f}"
    return f"{text}  round {record['round_seconds']:.2f}s (train {record['train_seconds']:.2f}s)"
