"""Experiments made of several runs: arms (a job and its flags) compared over seeds, and the table of their
results; ``jobs/compare_runs.py`` runs the arms and draws the plot (``devsim.observe.plots``).

Owns no run logic. May import the standard library and `devsim.observe.results` (what a results file holds);
nothing else in `devsim`, and never `processors`, `devsim_flare`, `jobs` or `nvflare`.
"""
