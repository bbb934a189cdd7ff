"""Arrays through files in a shared-memory folder (``--shared-memory``): bit-for-bit round trips, files taken once,
descriptors from a leaf checked before anything is read or unlinked, folders of dead servers removed, and the
flag resolved per environment."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsim.config import ConfigError, SimulationConfig
from devsim.shared_arrays import (
    FOLDER_PREFIX,
    FREE_PREFIX,
    MAX_FREE_FILES,
    SharedFolder,
    all_float32,
    put_arrays,
    remove_orphans,
    take_arrays,
)


def sample_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "conv.weight": rng.standard_normal((4, 3, 5, 5)).astype(np.float32),
        "conv.bias": np.array([np.nan, np.inf, -0.0, 1e-45], dtype=np.float32),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 7), dtype=np.float32),
        "fc.weight": rng.standard_normal((10, 13)).astype(np.float32)[:, ::2],  # not contiguous
    }


def data_files(folder: str) -> list[str]:
    """The files of ``folder`` a descriptor can name (free files kept for reuse left out)."""
    return [name for name in os.listdir(folder) if not name.startswith(FREE_PREFIX)]


def test_arrays_come_back_bit_for_bit_and_the_file_is_taken_once(tmp_path):
    folder = SharedFolder.create(str(tmp_path))
    sent = sample_arrays()
    descriptor = put_arrays(folder.path, sent)
    assert os.listdir(folder.path) == [os.path.basename(descriptor["path"])]
    received = folder.take(descriptor)
    assert list(received) == list(sent)
    for key, value in sent.items():
        assert received[key].shape == value.shape and received[key].dtype == np.float32
        assert received[key].tobytes() == np.ascontiguousarray(value).tobytes(), key
    assert data_files(folder.path) == []
    with pytest.raises(FileNotFoundError):
        folder.take(descriptor)
    folder.remove()
    assert not os.path.exists(folder.path)


def test_a_list_of_arrays_is_put_as_their_stack(tmp_path):
    folder = SharedFolder.create(str(tmp_path))
    rng = np.random.default_rng(0)
    versions = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3)]
    odd = rng.standard_normal(7).astype(np.float32)  # a size that is no multiple of the 64-byte alignment
    sent = {"w": versions, "one": [odd], "plain": odd[::2]}
    received = folder.take(put_arrays(folder.path, sent))
    assert received["w"].tobytes() == np.stack(versions).tobytes() and received["w"].shape == (3, 3, 5)
    assert received["one"].shape == (1, 7) and received["one"].tobytes() == odd.tobytes()
    assert received["plain"].tobytes() == np.ascontiguousarray(odd[::2]).tobytes()
    assert all_float32(sent)
    for bad in ([], [versions[0], odd], [versions[0], versions[1].astype(np.float64)]):
        assert not all_float32({"w": bad})
        with pytest.raises(ValueError, match="same-shape"):
            put_arrays(folder.path, {"w": bad})
    folder.remove()


def test_only_float32_is_put():
    assert all_float32({"a": np.zeros(3, np.float32)})
    assert not all_float32({"a": np.zeros(3, np.float64)}) and not all_float32({}) and not all_float32(None)
    with pytest.raises(ValueError, match="float32"):
        put_arrays("/nonexistent", {"a": np.zeros(3, np.int64)})


def test_a_path_outside_the_folder_is_refused_and_left_alone(tmp_path):
    (tmp_path / "shm").mkdir()
    folder = SharedFolder.create(str(tmp_path / "shm"))
    outside = tmp_path / "0123456789abcdef0123456789abcdef.bin"
    outside.write_bytes(b"\0" * 64)
    for path in [str(outside), "/etc/passwd", os.path.join(folder.path, "..", outside.name), None, 7]:
        with pytest.raises(ValueError, match="shared_file.path"):
            folder.take({"path": path, "entries": []})
    assert outside.exists()


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ("x", "expected a list"),
        ([["a", "<f8", [2], 0]], "dtype"),
        ([["a", "<f4", [-1], 0]], "shape"),
        ([["a", "<f4", [1000], 0]], "does not fit"),
        ([["a", "<f4", [2], 3]], "does not fit"),
        ([["a", "<f4", [2], 0], ["b", "<f4", [2], 0]], "does not fit"),
        ([["a", "<f4"]], "is not [key, dtype, shape, offset]"),
    ],
)
def test_entries_that_do_not_match_the_file_are_refused(tmp_path, entries, fragment):
    folder = SharedFolder.create(str(tmp_path))
    descriptor = put_arrays(folder.path, {"a": np.ones(2, np.float32)})
    with pytest.raises(ValueError, match="shared_file.entries") as error:
        take_arrays(folder.path, {"path": descriptor["path"], "entries": entries})
    assert fragment in str(error.value)


@settings(max_examples=60, deadline=None)
@given(entries=st.recursive(st.none() | st.integers() | st.text(max_size=5), lambda inner: st.lists(inner, max_size=4)))
def test_any_descriptor_entries_give_arrays_or_a_value_error(tmp_path_factory, entries):
    folder = SharedFolder.create(str(tmp_path_factory.mktemp("fuzz")))
    descriptor = put_arrays(folder.path, {"a": np.ones(3, np.float32)})
    try:
        arrays = take_arrays(folder.path, {"path": descriptor["path"], "entries": entries})
    except ValueError:
        return
    assert all(isinstance(value, np.ndarray) for value in arrays.values())


def test_folders_of_servers_that_are_gone_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"{FOLDER_PREFIX}{int(dead.stdout)}-abc"
    orphan.mkdir()
    (orphan / "0123456789abcdef0123456789abcdef.bin").write_bytes(b"x")
    mine = SharedFolder.create(str(tmp_path))
    assert not orphan.exists() and os.path.isdir(mine.path)
    assert remove_orphans(str(tmp_path)) == []
    mine.remove()


def test_the_flag_is_on_only_where_server_and_leaves_share_the_host(monkeypatch):
    from devsim_flare import cli

    monkeypatch.setattr("devsim.shared_arrays.shared_memory_root", lambda: "/dev/shm")
    auto = SimulationConfig()
    assert cli.with_shared_memory(auto, "sim", simulated_here=True).shared_memory == "on"
    assert cli.with_shared_memory(auto, "sim", simulated_here=False).shared_memory == "off"  # exported job folder
    assert cli.with_shared_memory(auto, "poc", simulated_here=False).shared_memory == "off"
    on = SimulationConfig(shared_memory="on")
    assert cli.with_shared_memory(on, "poc", simulated_here=False).shared_memory == "on"
    with pytest.raises(ConfigError, match="--shared-memory: 'on' needs the server and its leaves on one host"):
        cli.with_shared_memory(on, "prod", simulated_here=False)
    monkeypatch.setattr("devsim.shared_arrays.shared_memory_root", lambda: None)
    assert cli.with_shared_memory(auto, "sim", simulated_here=True).shared_memory == "off"
    with pytest.raises(ConfigError, match="needs a writable /dev/shm"):
        cli.with_shared_memory(on, "sim", simulated_here=True)


def test_a_full_shared_memory_sends_the_arrays_inline_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    """A write that fails (ENOSPC: a container's /dev/shm is often 64 MB) leaves no file; the caller sends inline."""
    import devsim.shared_arrays as shared_arrays

    folder = SharedFolder.create(str(tmp_path))
    arrays = {"a": np.ones(100, np.float32), "b": np.ones(100, np.float32)}
    assert shared_arrays.shared_or_inline(None, arrays) is None
    assert shared_arrays.shared_or_inline(folder.path, {"a": np.ones(3)}) is None  # float64: inline as it is
    writes = []
    real = np.ascontiguousarray

    def second_write_fails(value):
        writes.append(1)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        return real(value)

    monkeypatch.setattr(shared_arrays, "_failure_reported", False)
    monkeypatch.setattr(shared_arrays.np, "ascontiguousarray", second_write_fails)
    assert shared_arrays.shared_or_inline(folder.path, arrays) is None
    assert shared_arrays.shared_or_inline(folder.path, arrays) is not None  # the third write succeeds again
    printed = capsys.readouterr().out
    assert printed.count("No space left on device") == 1 and "inside NVFlare's messages" in printed
    assert len(os.listdir(folder.path)) == 1


def test_no_exchange_folder_when_off_or_when_it_cannot_be_made(monkeypatch, capsys):
    import devsim.shared_arrays as shared_arrays

    assert shared_arrays.open_exchange("off") is None

    def cannot(root=None):
        raise PermissionError(13, "Permission denied", "/dev/shm")

    monkeypatch.setattr(shared_arrays.SharedFolder, "create", cannot)
    assert shared_arrays.open_exchange("on") is None
    assert "no exchange folder" in capsys.readouterr().out


def test_a_call_and_its_reply_through_the_folder(tmp_path):
    """The server's model for several leaves is written once (``keep``) and discarded by the server; each leaf's
    reply file is taken by the server; without a folder, or with an unwritten model, the arrays go inline."""
    from devsim.shared_arrays import (
        DESCRIPTOR_KEY,
        received_weights,
        reply_arrays_taken,
        reply_in_file,
        shared_or_inline,
        weights_for_call,
    )

    folder = SharedFolder.create(str(tmp_path))
    model = sample_arrays()
    assert weights_for_call(model, None, None) == {"weights": model}
    assert weights_for_call(model, folder.path, None)["weights"] is model  # could not be written: inline
    shared = shared_or_inline(folder.path, model, keep=True)
    kwargs = weights_for_call(model, folder.path, shared)
    assert kwargs["weights"] == {} and kwargs["exchange_folder"] == folder.path
    for _ in range(2):  # two leaves read the same file
        got = received_weights(kwargs["weights"], kwargs["exchange_folder"], kwargs["shared_weights"])
        assert all(got[k].tobytes() == np.ascontiguousarray(v).tobytes() for k, v in model.items())
    folder.discard(shared)
    assert os.listdir(folder.path) == []

    payload = {"delta_sum": {"a": np.arange(5, dtype=np.float32)}, "total_weight": 3.0}
    reply_in_file(payload, "delta_sum", folder.path)
    assert "delta_sum" not in payload and DESCRIPTOR_KEY in payload
    with pytest.raises(ValueError, match="no exchange folder"):
        reply_arrays_taken(dict(payload), "delta_sum", None)
    reply_arrays_taken(payload, "delta_sum", folder)
    assert payload["delta_sum"]["a"].tolist() == [0, 1, 2, 3, 4] and data_files(folder.path) == []
    inline = {"delta_sum": {"a": np.zeros(2)}}  # float64 (a wire fault's): stays inline
    reply_in_file(inline, "delta_sum", folder.path)
    assert "delta_sum" in inline and DESCRIPTOR_KEY not in inline


def test_a_reply_after_the_run_removed_its_folder_goes_inline_without_a_warning(tmp_path, monkeypatch, capsys):
    """A stopped run (Ctrl-C) removes its exchange folder while leaves may still be replying: their writes fail
    with 'no such file', which is the run's end, not a shared-memory problem to report."""
    import devsim.shared_arrays as shared_arrays

    monkeypatch.setattr(shared_arrays, "_failure_reported", False)
    folder = SharedFolder.create(str(tmp_path))
    folder.remove()
    assert shared_arrays.shared_or_inline(folder.path, {"a": np.ones(4, np.float32)}) is None
    assert capsys.readouterr().out == ""
    assert not shared_arrays._failure_reported


def test_a_call_whose_run_removed_its_folder_says_so_and_other_missing_files_still_raise(tmp_path):
    """The weights' file gone with its folder means the run ended (ExchangeClosed, which the leaf answers
    quietly); a missing file in a folder that still exists is a real error."""
    from devsim.shared_arrays import ExchangeClosed, received_weights

    folder = SharedFolder.create(str(tmp_path))
    descriptor = put_arrays(folder.path, {"a": np.ones(4, np.float32)})
    os.unlink(descriptor["path"])
    with pytest.raises(FileNotFoundError):
        received_weights({}, folder.path, descriptor)
    folder.remove()
    with pytest.raises(ExchangeClosed):
        received_weights({}, folder.path, descriptor)


def test_taken_files_are_reused_bit_for_bit_and_their_number_is_bounded(tmp_path):
    """A taken file is kept free and the next write claims it (the smallest that holds it, else the largest):
    a shorter write into a longer file and a longer one into a shorter file read back exactly, a free file is
    never a descriptor's, and a folder keeps at most MAX_FREE_FILES however many files are taken."""
    folder = SharedFolder.create(str(tmp_path))
    rng = np.random.default_rng(1)
    big = {"a": rng.standard_normal(5000).astype(np.float32), "b": rng.standard_normal((7, 3)).astype(np.float32)}
    small = {"a": rng.standard_normal(10).astype(np.float32)}
    folder.take(put_arrays(folder.path, big))
    (free_name,) = os.listdir(folder.path)
    assert free_name.startswith(f"{FREE_PREFIX}{os.path.getsize(os.path.join(folder.path, free_name))}-")
    with pytest.raises(ValueError, match="is not a file of the run's exchange folder"):
        folder.take({"path": os.path.join(folder.path, free_name), "entries": []})
    descriptor = put_arrays(folder.path, small)  # claims the free file: shorter than what it held
    assert os.listdir(folder.path) == [os.path.basename(descriptor["path"])]
    assert os.path.getsize(descriptor["path"]) == 64
    assert folder.take(descriptor)["a"].tobytes() == small["a"].tobytes()
    descriptor = put_arrays(folder.path, big)  # the only free file is too short: it grows
    got = folder.take(descriptor)
    assert all(got[k].tobytes() == v.tobytes() for k, v in big.items())
    held = [put_arrays(folder.path, small) for _ in range(MAX_FREE_FILES + 5)]
    for descriptor in held:
        folder.take(descriptor)
    names = os.listdir(folder.path)
    assert len(names) == MAX_FREE_FILES and all(name.startswith(FREE_PREFIX) for name in names)
    folder.remove()
    assert not os.path.exists(folder.path)


def test_writers_in_threads_never_share_a_file(tmp_path):
    """Writers racing for the same free files each end with a file of their own holding exactly their arrays."""
    from concurrent.futures import ThreadPoolExecutor

    folder = SharedFolder.create(str(tmp_path))
    for _ in range(4):
        folder.take(put_arrays(folder.path, {"a": np.zeros(100, np.float32)}))

    def write_and_read(index: int) -> bool:
        sent = {"a": np.full(100 + index, index, np.float32)}
        return folder.take(put_arrays(folder.path, sent))["a"].tobytes() == sent["a"].tobytes()

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(write_and_read, range(200)))
    assert data_files(folder.path) == []
    folder.remove()
