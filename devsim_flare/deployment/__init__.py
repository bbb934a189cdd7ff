"""A provisioned NVFlare deployment on this machine: provisioning from a project file (TLS certificates,
ports, startup kits), starting and stopping its processes, the admin session. Used by
``scripts/deployment.py`` (the Collab jobs) and ``scripts/edge_system.py`` (the edge hierarchy)."""
