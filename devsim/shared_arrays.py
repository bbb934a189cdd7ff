"""Model arrays handed between the server and its leaves through files in shared memory (``/dev/shm``) when they
run on one host, so that only a short descriptor crosses NVFlare's messaging.

An asynchronous leaf call returns every device job's delta (one model of float32 per job): at the CNN's 62k
parameters and 5 jobs a call that is 1.24 MB a reply, which NVFlare serialises, streams and decodes in Python
threads on both sides. Written into a tmpfs file and read back, the same bytes cost two memory copies. Nothing
about the run changes: the arrays arrive bit for bit as they were sent.

The server owns one folder per run (:meth:`SharedFolder.create`, mode 0700, named with its process id) and
removes it when the run ends, with any file no one took (a reply to a call the run stopped waiting for); a folder
left by a server that was killed is removed by the next one (its process id is gone). A file is taken (read
and recycled) by its one reader, except a synchronous round's model, which every leaf reads (``keep``) and the
server discards after the round. A taken file is not unlinked but renamed to a free name (``free-<bytes>-...``)
that the next writer claims and overwrites: tmpfs gives a new file fresh zeroed pages, which cost 6x the copy
(3 MB: 1.18 ms to a new file, 0.19 ms over a used one); a folder keeps at most :data:`MAX_FREE_FILES`. A
descriptor from a leaf is checked before its file is read: the path must be a file of this folder, the entries
float32 and their sizes must add up to the file's. Arrays that cannot be written (no folder, a full
``/dev/shm``) travel inside the message as before (:func:`shared_or_inline`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Mapping

import numpy as np

SHARED_MEMORY_ROOT = "/dev/shm"
FOLDER_PREFIX = "devsim-exchange-"
DESCRIPTOR_KEY = "shared_file"
"""The key under which a descriptor replaces the arrays it stands for in a payload."""
_FILE_NAME = re.compile(r"^[0-9a-f]{32}\.bin$")
_ALIGN = 64
"""Bytes each entry starts on in a file (so every entry's view is aligned for its dtype)."""
_DTYPES = {np.dtype(np.float32).str}
FREE_PREFIX = "free-"
"""Name prefix of a taken file kept for reuse: ``free-<size in bytes>-<name>``; no descriptor can name one."""
MAX_FREE_FILES = 16
"""Free files a folder keeps at most (an asynchronous run has about two calls per leaf in flight); a file taken
beyond them is unlinked."""
_PROCESS_TOKEN = secrets.token_hex(4)
_COUNTER = itertools.count()


def shared_memory_root() -> str | None:
    """The shared-memory folder when this host has a writable one, else None."""
    root = SHARED_MEMORY_ROOT
    return root if os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK) else None


class SharedFolder:
    """One run's exchange folder; ``path`` is what the leaves are told to write into and read from."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)

    @classmethod
    def create(cls, root: str | None = None) -> SharedFolder:
        """A new folder under ``root`` (default :data:`SHARED_MEMORY_ROOT`) after removing folders of servers that
        are gone. Raises OSError when it cannot be made."""
        root = root or SHARED_MEMORY_ROOT
        remove_orphans(root)
        return cls(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir=root))

    def take(self, descriptor: Mapping) -> dict[str, np.ndarray]:
        """The arrays of a descriptor from :func:`put_arrays` into this folder, read and unlinked.

        Raises:
            ValueError: the descriptor names no file of this folder, or its entries do not match the file.
        """
        return take_arrays(self.path, descriptor)

    def discard(self, descriptor: Mapping) -> None:
        """Unlink the file of one of this server's own descriptors (one several leaves read, ``keep``)."""
        with contextlib.suppress(OSError):
            os.unlink(_checked_path(self.path, descriptor.get("path")))

    def remove(self) -> None:
        """Remove the folder with every file still in it."""
        shutil.rmtree(self.path, ignore_errors=True)


def open_exchange(mode: str) -> SharedFolder | None:
    """The run's exchange folder for ``--shared-memory`` ``mode`` (resolved: ``on`` or ``off``); None when off, or
    when the folder cannot be made (printed: the run's arrays then go inside NVFlare's messages)."""
    if mode != "on":
        return None
    try:
        return SharedFolder.create()
    except OSError as error:
        print(f"[shared memory] no exchange folder ({error}); model arrays go inside NVFlare's messages", flush=True)
        return None


def weights_for_call(weights: Mapping, folder: str | None, shared: dict | None) -> dict:
    """Keyword arguments of a leaf method carrying ``weights``: inline without an exchange ``folder``, else the
    folder and ``shared`` (the descriptor of ``weights``, or None when they could not be written: then inline)."""
    if folder is None:
        return {"weights": weights}
    return {"exchange_folder": folder, "weights": {} if shared else weights, "shared_weights": shared}


class ExchangeClosed(Exception):
    """The exchange folder a call names is gone: its server removed it because the run ended (e.g. on Ctrl-C)
    after sending the call, so no one waits for the answer."""


def received_weights(weights: dict, folder: str | None, shared: Mapping | None) -> dict:
    """On the leaf: the weights a :func:`weights_for_call` call carried.

    Raises:
        ExchangeClosed: the weights' file and its folder are gone (the run has ended).
    """
    if folder is None or shared is None:
        return weights
    try:
        return take_arrays(folder, shared, unlink=not shared.get("keep", False))
    except FileNotFoundError as error:
        if os.path.isdir(folder):
            raise
        raise ExchangeClosed(folder) from error


def reply_in_file(payload: dict, key: str, folder: str | None) -> None:
    """On the leaf: move the float32 arrays of ``payload[key]`` into a file of ``folder`` (their descriptor under
    :data:`DESCRIPTOR_KEY`) when it can be written; else they stay inline."""
    shared = shared_or_inline(folder, payload.get(key))
    if shared is not None:
        payload[DESCRIPTOR_KEY] = shared
        del payload[key]


def reply_arrays_taken(payload, key: str, exchange: SharedFolder | None) -> None:
    """On the server: put back ``payload[key]`` from the file a leaf's :func:`reply_in_file` wrote.

    Raises:
        ValueError, OSError: the descriptor names no readable file of this run's folder, or the run has none.
    """
    if not (isinstance(payload, dict) and DESCRIPTOR_KEY in payload):
        return
    if exchange is None:
        raise ValueError("a shared_file reply, but this run has no exchange folder")
    payload[key] = exchange.take(payload.pop(DESCRIPTOR_KEY))


def all_float32(arrays) -> bool:
    """Whether ``arrays`` is a non-empty mapping of float32 NumPy arrays, or of non-empty lists of same-shape float32
    arrays (each one stacked entry), which is what :func:`put_arrays` takes."""
    return isinstance(arrays, Mapping) and bool(arrays) and all(_parts(v) is not None for v in arrays.values())


def _parts(value) -> list[np.ndarray] | None:
    """The float32 arrays an entry of :func:`put_arrays` is made of (one for an array, a list's arrays in order), or
    None when it is not such an entry."""
    parts = [value] if isinstance(value, np.ndarray) else value if isinstance(value, list) and value else None
    if parts is None or any(not isinstance(p, np.ndarray) or p.dtype.str not in _DTYPES for p in parts):
        return None
    return parts if all(p.shape == parts[0].shape for p in parts) else None


def shared_or_inline(folder: str | None, arrays, keep: bool = False) -> dict | None:
    """The descriptor of ``arrays`` written into ``folder``, or None when they should travel inside the message:
    no folder, not all float32 (e.g. an update a fault made float64), or the write failed (``/dev/shm`` full: a
    container's is often 64 MB). The first failure in a process is printed once; a folder that is gone is not a
    failure (the server removes it when its run ends, e.g. on Ctrl-C, while leaves may still reply). With ``keep``
    its readers leave the file in place (several leaves read it; the writer discards it)."""
    global _failure_reported
    if folder is None or not all_float32(arrays):
        return None
    try:
        return {**put_arrays(folder, arrays), "keep": True} if keep else put_arrays(folder, arrays)
    except OSError as error:
        if not os.path.isdir(folder):
            return None  # the server removed its folder: its run has ended and will not read this reply
        if not _failure_reported:
            _failure_reported = True
            print(
                f"[shared memory] {error}; model arrays that cannot be written go inside NVFlare's messages", flush=True
            )
        return None


_failure_reported = False


def put_arrays(folder: str, arrays: Mapping[str, np.ndarray | list[np.ndarray]]) -> dict:
    """Write ``arrays`` into a new file of ``folder`` (each entry at a 64-byte boundary); its descriptor:
    ``{"path", "entries": [[key, dtype, shape, offset], ...]}``. A list of V same-shape arrays is written as one
    ``(V, *shape)`` entry, what ``np.stack`` of them would be, without that copy. Raises ValueError for an entry
    that is neither a float32 array nor a non-empty list of same-shape float32 arrays."""
    entries, offset, stacked = [], 0, []
    for key, value in arrays.items():
        parts = _parts(value)
        if parts is None:
            kind = getattr(value, "dtype", type(value).__name__)
            raise ValueError(f"shared arrays must be float32 NumPy arrays or lists of same-shape ones; {key} is {kind}")
        shape = [int(n) for n in parts[0].shape]
        entries.append([str(key), parts[0].dtype.str, shape if parts[0] is value else [len(parts), *shape], offset])
        stacked.append(parts)
        offset += -(-sum(p.nbytes for p in parts) // _ALIGN) * _ALIGN
    path = os.path.join(folder, _new_name())
    try:
        if _claim_free(folder, path, offset):
            fd = os.open(path, os.O_WRONLY)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for (_, _, _, start), parts in zip(entries, stacked, strict=True):
                for part in parts:
                    if part.size:
                        _write_at(fd, memoryview(np.ascontiguousarray(part).reshape(-1)).cast("B"), start)
                    start += part.nbytes
            os.ftruncate(fd, offset)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # no half-written file stays behind
        raise
    return {"path": path, "entries": entries}


def take_arrays(folder: str, descriptor: Mapping, unlink: bool = True) -> dict[str, np.ndarray]:
    """Read (and with ``unlink`` take away: recycle, see :func:`_recycle`) the file of ``descriptor`` (see
    :func:`put_arrays`), which must lie in ``folder``."""
    path = _checked_path(folder, descriptor.get("path") if isinstance(descriptor, Mapping) else None)
    raw = None
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    finally:
        if unlink:
            _recycle(path, None if raw is None else raw.nbytes)
    arrays = {}
    for entry in _checked_entries(descriptor.get("entries"), raw.nbytes):
        key, dtype, shape, offset = entry
        size = math.prod(shape) * np.dtype(dtype).itemsize
        arrays[key] = raw[offset : offset + size].view(dtype).reshape(shape)
    return arrays


def _new_name() -> str:
    """A file name unique in the run's folder without a system call: process id, a token drawn once per process
    and a counter (32 hex digits, as :data:`_FILE_NAME` wants)."""
    return f"{os.getpid() & 0xFFFFFFFF:08x}{_PROCESS_TOKEN}{next(_COUNTER) & (2**64 - 1):016x}.bin"


def _free_files(folder: str) -> list[tuple[int, str]]:
    """(size in bytes, path) of the folder's free files, smallest first."""
    free = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith(FREE_PREFIX):
                size = entry.name[len(FREE_PREFIX) :].split("-", 1)[0]
                if size.isdigit():
                    free.append((int(size), entry.path))
    return sorted(free)


def _claim_free(folder: str, path: str, nbytes: int) -> bool:
    """Rename a free file of ``folder`` to ``path`` (the smallest that holds ``nbytes``, else the largest): True
    when one was claimed. Another writer may claim the same file first; the next is tried."""
    free = _free_files(folder)
    for _, candidate in [item for item in free if item[0] >= nbytes] or free[-1:]:
        try:
            os.rename(candidate, path)
            return True
        except FileNotFoundError:
            continue
    return False


def _recycle(path: str, size: int | None) -> None:
    """Keep a taken file of ``size`` bytes (None: read it from the file) for the next writer (renamed free, its size
    in the name), or unlink it when the folder already keeps :data:`MAX_FREE_FILES` (or it cannot be renamed)."""
    folder = os.path.dirname(path)
    try:
        if len(_free_files(folder)) < MAX_FREE_FILES:
            size = os.stat(path).st_size if size is None else size
            os.rename(path, os.path.join(folder, f"{FREE_PREFIX}{size}-{_new_name()}"))
            return
    except FileNotFoundError:
        return
    except OSError:
        pass
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    """All of ``data`` at ``offset`` of ``fd`` (``pwrite`` may write less than asked)."""
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def remove_orphans(root: str) -> list[str]:
    """Remove exchange folders under ``root`` whose server process is gone; their paths."""
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            match = re.match(rf"^{FOLDER_PREFIX}(\d+)-", name)
            if match and not _alive(int(match.group(1))):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                removed.append(os.path.join(root, name))
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user, which refuses the signal, counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _checked_path(folder: str, path) -> str:
    if not isinstance(path, str) or os.path.dirname(path) != folder or not _FILE_NAME.match(os.path.basename(path)):
        raise ValueError(f"shared_file.path: {path!r} is not a file of the run's exchange folder {folder}")
    return path


def _checked_entries(entries, file_bytes: int) -> list[tuple[str, str, tuple[int, ...], int]]:
    if not isinstance(entries, list):
        raise ValueError("shared_file.entries: expected a list of [key, dtype, shape, offset]")
    checked, end = [], 0
    for entry in entries:
        if not (isinstance(entry, list | tuple) and len(entry) == 4):
            raise ValueError(f"shared_file.entries: {entry!r} is not [key, dtype, shape, offset]")
        key, dtype, shape, offset = entry
        if not isinstance(key, str):
            raise ValueError(f"shared_file.entries: key {key!r} is not a string")
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise ValueError(f"shared_file.entries: dtype {dtype!r} of {key!r}; allowed: {sorted(_DTYPES)}")
        if not (isinstance(shape, list | tuple) and all(isinstance(n, int) and n >= 0 for n in shape)):
            raise ValueError(f"shared_file.entries: shape {shape!r} of {key!r} is not a list of sizes >= 0")
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if not (isinstance(offset, int) and offset >= end and offset % _ALIGN == 0 and offset + size <= file_bytes):
            raise ValueError(f"shared_file.entries: {key!r} at offset {offset!r} does not fit the file's {file_bytes}")
        checked.append((str(key), dtype, tuple(shape), offset))
        end = offset + size
    return checked
