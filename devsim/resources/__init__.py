"""What the host gives a process: worker counts sized from CPU cores and free VRAM, the batched-device
size (`--device-batch`) from free RAM/VRAM, GPU placement of leaves, and process-level memory settings
(garbage-collector freezing).

May import `devsim.config` and the standard library, torch and psutil; nothing that trains or
aggregates.
"""
