"""User-level differential privacy for federated rounds (no NVFlare here; docs/privacy.md).

- :mod:`~devsim.privacy.settings`: the ``--dp-*`` flags and their checks (a section of the run configuration);
- :mod:`~devsim.privacy.plan`: a run's resolved mechanism (sampling rate, denominator, noise multipliers, event);
- :mod:`~devsim.privacy.device`, :mod:`~devsim.privacy.clipping`: per-device clipping (and local noise);
- :mod:`~devsim.privacy.server`: noise on the round's sum, fixed denominator, adaptive clipping, accounting;
- :mod:`~devsim.privacy.accountant`: ``dp-accounting``'s RDP and PLD accountants, the noise-multiplier solver;
- :mod:`~devsim.privacy.sampling`, :mod:`~devsim.privacy.noise`: seeded Poisson selection and Gaussian noise.

Submodules are imported where used, so that reading a configuration does not load the accountant library.
"""
