"""The task contract: the functions a user's task file defines, and how the file is found and imported.

A task file (``--task path/to/my_task.py``) or importable module (``--task package.module``) defines:

===========================================  ========  ==================================================
function                                     needed    what it returns
===========================================  ========  ==================================================
``model()``                                  required  a fresh ``torch.nn.Module`` (the global model at version 0
                                                       is built from it after seeding torch with the run seed)
``data()``                                   required  a dict of arrays (NumPy or torch): ``x_train``, ``y_train``,
                                                       ``x_test``, ``y_test``; optional ``owner_train`` (one int per
                                                       training sample: the device that holds it)
``loss(outputs, targets)``                   optional  a scalar tensor (default: cross-entropy)
``metrics(outputs, targets)``                optional  a dict of floats over the whole test set (default: accuracy)
``prepare(x)``                               optional  the model's inputs for a batch of stored rows ``x``
                                                       ``(n, *sample_shape)``, run on the compute device (e.g.
                                                       ``x.float() / 255``; default: the rows as stored)
``augment(inputs, generator)``               optional  augmented training inputs, same shape (used with
                                                       ``--augment``; random draws from the CPU ``generator``)
``generator(latent_dim, num_classes)``       optional  FedRevive: an ``nn.Module`` mapping ``(z, labels)`` to
                                                       model inputs, for tasks whose inputs the built-in
                                                       generators cannot produce (token ids)
===========================================  ========  ==================================================

and, optionally, the constant ``LOWER_IS_BETTER``: the names of ``metrics()`` values for which lower is better
(e.g. ``("wer",)``), recorded in the run's results so that comparisons rank them the right way without being told.

Everything here is plain Python: :func:`load_hooks` imports the file or module and returns its functions as
:class:`TaskHooks`; :mod:`devsim.tasks.checks` validates what they return. Every problem is a
:class:`TaskError` whose message names the task and, for an exception raised inside the task's own code,
the line of the task file it came from.

A job ships the task file in its ``custom/`` folder as ``devsim_user_task/<file name>``
(:data:`SHIPPED_FOLDER`); at a site :func:`locate` prefers that copy, so an exported job folder, a POC
deployment and a production site run exactly the file the job was built with.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from devsim.shipped import find_shipped

REQUIRED_HOOKS: tuple[str, ...] = ("model", "data")
OPTIONAL_HOOKS: tuple[str, ...] = ("loss", "metrics", "prepare", "augment", "generator")
REQUIRED_DATA_KEYS: tuple[str, ...] = ("x_train", "y_train", "x_test", "y_test")
OPTIONAL_DATA_KEYS: tuple[str, ...] = ("owner_train",)
SHIPPED_FOLDER = "devsim_user_task"


class TaskError(ValueError):
    """A task cannot be used; the message names the task (its file or module) and the problem."""

    def __init__(self, origin: str, message: str):
        self.origin = origin
        self.problem = message
        super().__init__(f"task {origin}: {message}")


@dataclass(frozen=True)
class TaskHooks:
    """The functions of one task, as written by its author (``None``: not defined, the default applies).

    ``origin`` names the task in messages (the file path or module name); ``file`` is the source file whose
    lines are quoted when the task's own code raises (None for built-in tasks).
    """

    origin: str
    model: Callable
    data: Callable
    loss: Callable | None = None
    metrics: Callable | None = None
    prepare: Callable | None = None
    augment: Callable | None = None
    generator: Callable | None = None
    file: str | None = None
    lower_is_better: tuple[str, ...] = ()


def is_file_spec(spec: str) -> bool:
    """Whether ``--task`` names a file (ends in ``.py`` or contains a path separator) rather than a module."""
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def shipped_copy(spec: str) -> str | None:
    """The copy of ``spec``'s file that a job carries (``<custom dir>/devsim_user_task/<name>.py`` on
    ``sys.path``), or None outside a job."""
    name = os.path.basename(spec) if is_file_spec(spec) else spec.rpartition(".")[2] + ".py"
    return find_shipped(os.path.join(SHIPPED_FOLDER, name))


def source_file(spec: str) -> str:
    """The file a job ships for ``spec``: the file itself, or the module's source file (without importing it)."""
    if is_file_spec(spec):
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise TaskError(spec, f"no such file {path!r}")
        return path
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError) as error:
        raise TaskError(spec, f"cannot find module {spec!r}: {error}") from error
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise TaskError(spec, f"no Python module {spec!r} on the import path (give a file: --task path/to/task.py)")
    return found.origin


def locate(spec: str) -> tuple[str | None, str | None]:
    """Where to load ``spec`` from: ``(file, None)`` to load a file, or ``(None, module)`` to import a module.

    A copy shipped with the job wins; otherwise a file spec is the file (relative to the working folder) and
    a module spec is imported by name.
    """
    shipped = shipped_copy(spec)
    if shipped is not None:
        return shipped, None
    if is_file_spec(spec):
        return os.path.abspath(spec), None
    return None, spec


def load_hooks(spec: str) -> TaskHooks:
    """Import the task named by ``spec`` (a file path or a module name) and return its functions.

    Raises:
        TaskError: the file or module is missing, importing it raised (the message quotes the task file's
            line), a required function is missing, or a name of the contract is not callable.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise TaskError(repr(spec), "--task needs a file path (my_task.py) or a module name (package.module)")
    path, module_name = locate(spec)
    module = _import_file(spec, path) if path is not None else _import_module(spec, module_name)
    file = getattr(module, "__file__", None)
    functions: dict[str, Callable | None] = {}
    for name in REQUIRED_HOOKS + OPTIONAL_HOOKS:
        value = getattr(module, name, None)
        if value is None and name in REQUIRED_HOOKS:
            defined = sorted(n for n in REQUIRED_HOOKS + OPTIONAL_HOOKS if getattr(module, n, None) is not None)
            raise TaskError(
                spec,
                f"defines no {name}() (required: {', '.join(f'{n}()' for n in REQUIRED_HOOKS)}; "
                f"found: {', '.join(defined) or 'none of the task functions'})",
            )
        if value is not None and not callable(value):
            raise TaskError(spec, f"{name} must be a function, got {type(value).__name__}")
        functions[name] = value
    return TaskHooks(origin=spec, file=file, lower_is_better=_lower_is_better(spec, module), **functions)


def _lower_is_better(spec: str, module: ModuleType) -> tuple[str, ...]:
    """The task's ``LOWER_IS_BETTER`` metric names (none when it defines none)."""
    names = getattr(module, "LOWER_IS_BETTER", ())
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) and n for n in names):
        raise TaskError(spec, f"LOWER_IS_BETTER must be a tuple of metric names, got {names!r}")
    return tuple(names)


def _import_file(spec: str, path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise TaskError(spec, f"no such file {path!r}")
    stem = os.path.splitext(os.path.basename(path))[0]
    name = f"devsim_task_{''.join(c if c.isalnum() else '_' for c in stem)}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise TaskError(spec, f"{path!r} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(name, None)
        raise TaskError(spec, f"importing it failed: {describe_exception(error, path)}") from error
    return module


def _import_module(spec: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise TaskError(
                spec, f"no module {module_name!r} on the import path (give a file: --task path/to/task.py)"
            ) from error
        raise TaskError(spec, f"importing it failed: {describe_exception(error, None)}") from error
    except Exception as error:
        raise TaskError(spec, f"importing it failed: {describe_exception(error, None)}") from error


def describe_exception(error: BaseException, task_file: str | None) -> str:
    """``Type: message (file, line N: source)`` quoting the deepest frame inside ``task_file``, so a user sees which
    line of their task raised (no location when none of its lines is on the stack, e.g. a layer of an
    ``nn.Sequential`` failed; without ``task_file``, the deepest frame of the traceback)."""
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, SyntaxError) and error.filename:
        where = f" ({error.filename}, line {error.lineno}: {(error.text or '').strip()})"
        return f"SyntaxError: {error.msg}{where}"
    if task_file is not None:
        real = os.path.realpath(task_file)
        inside = [f for f in frames if os.path.realpath(f.filename) == real]
        chosen = inside[-1] if inside else None
    else:
        chosen = frames[-1] if frames else None
    where = f" ({chosen.filename}, line {chosen.lineno}: {(chosen.line or '').strip()})" if chosen else ""
    return f"{type(error).__name__}: {error}{where}"
