"""A package's exported names imported on first use (PEP 562 module ``__getattr__``), so that importing one light
module of the package (its settings, which the run configuration imports) does not import PyTorch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each name of ``homes`` (name -> the module that defines it) is imported
    from its module when first read; any other name raises AttributeError."""

    def attribute(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return attribute
