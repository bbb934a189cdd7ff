"""The batching probe: whether a leaf trains its devices as one batched group pays on this machine, timed once and
the verdict kept per model, task, settings and machine."""
