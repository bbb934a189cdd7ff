"""How NVFlare's simulator processes start: a fork server (:mod:`devsim_flare.launch.fork_server`), forked from the job
command with PyTorch and NVFlare already imported, runs the simulator's server and leaf processes as ``python -m``
would; :mod:`devsim_flare.launch.forked_process` routes NVFlare's ``subprocess.Popen`` of those modules to it."""
