"""The task contract: loading a task file or module, what it must return, and one clear line for every bad task."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from devsim.tasks import TaskError, load_task, task_from_settings
from devsim.tasks.contract import SHIPPED_FOLDER, describe_exception, load_hooks, locate
from tests.conftest import REPO, isolated_env

GOOD = """
import numpy as np
import torch
from torch import nn

def model():
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))

def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4))
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    return {"x_train": x[:40], "y_train": y[:40], "x_test": x[40:], "y_test": y[40:],
            "owner_train": np.arange(40) // 4}
"""


def write_task(tmp_path, body: str, name: str = "my_task.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_good_task_file_loads_with_defaults_and_owners(tmp_path):
    task = load_task({"task": write_task(tmp_path, GOOD)})
    assert task.classification and task.num_classes == 3 and task.num_owners == 10
    assert task.x_train.dtype == np.float32 and task.y_train.dtype == np.int64 and task.sample_shape == (4,)
    outputs = torch.zeros(5, 3)
    outputs[:, 1] = 1.0
    assert task.metrics(outputs, torch.tensor([1, 1, 0, 1, 2])) == {"accuracy": 0.6}
    assert float(task.loss(outputs, torch.tensor([1, 1, 1, 1, 1]))) < float(task.loss(outputs, torch.zeros(5).long()))
    assert task.name == "my_task" and "60" not in task.describe() and "10 owners" in task.describe()


MISSES = """
def metrics(outputs, targets):
    miss = float((outputs.argmax(1) != targets).float().mean())
    return {"accuracy": 1.0 - miss, "miss": miss}
"""


def test_lower_is_better_names_metrics_the_task_returns(tmp_path):
    task = load_task({"task": write_task(tmp_path, GOOD + MISSES + "LOWER_IS_BETTER = ('miss',)\n")})
    assert task.record()["lower_is_better"] == ["miss"]
    assert load_task({"task": write_task(tmp_path, GOOD, "plain.py")}).record()["lower_is_better"] == []
    for tail, words in (
        ("LOWER_IS_BETTER = 'miss'\n", "LOWER_IS_BETTER must be a tuple of metric names, got 'miss'"),
        (
            "LOWER_IS_BETTER = ('wer',)\n",
            "LOWER_IS_BETTER names 'wer', which metrics() does not return (it returns accuracy, miss)",
        ),
    ):
        with pytest.raises(TaskError, match=words.replace("(", r"\(").replace(")", r"\)")):
            load_task({"task": write_task(tmp_path, GOOD + MISSES + tail, "bad.py")})
    with pytest.raises(TaskError, match="LOWER_IS_BETTER names metrics, but the task defines no metrics"):
        load_task({"task": write_task(tmp_path, GOOD + "LOWER_IS_BETTER = ('miss',)\n", "none.py")})


def test_a_module_task_loads_by_name(tmp_path, monkeypatch):
    package = tmp_path / "user_tasks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tabular.py").write_text(textwrap.dedent(GOOD))
    monkeypatch.syspath_prepend(str(tmp_path))
    task = load_task({"task": "user_tasks.tabular"})
    assert task.name == "user_tasks.tabular" and task.num_classes == 3


def test_a_shipped_copy_wins_over_the_original_path(tmp_path, monkeypatch):
    """A job carries the file in custom/devsim_user_task/; sites load that copy, not the launcher's path."""
    original = write_task(tmp_path, GOOD)
    custom = tmp_path / "custom"
    (custom / SHIPPED_FOLDER).mkdir(parents=True)
    shipped = custom / SHIPPED_FOLDER / "my_task.py"
    shipped.write_text(textwrap.dedent(GOOD).replace("nn.Linear(16, 3)", "nn.Linear(16, 5)"))
    assert locate(original) == (original, None)
    monkeypatch.syspath_prepend(str(custom))
    assert locate(original) == (str(shipped), None)
    assert load_task({"task": original}).num_classes == 5
    os.remove(original)
    assert load_task({"task": original}).num_classes == 5


def test_the_process_cache_holds_one_task(tmp_path):
    first = write_task(tmp_path, GOOD, "first.py")
    second = write_task(tmp_path, GOOD, "second.py")
    assert task_from_settings({"task": first}) is task_from_settings({"task": first})
    other = task_from_settings({"task": second})
    assert other is not task_from_settings({"task": first}) and other.name == "second"


def test_a_regression_task_needs_its_own_loss_and_reports_its_metrics(tmp_path):
    body = GOOD.replace("y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)", "y = x[:, :1] * 2.0")
    body = body.replace("nn.Linear(16, 3)", "nn.Linear(16, 1)")
    with pytest.raises(TaskError, match="define loss"):
        load_task({"task": write_task(tmp_path, body, "regression.py")})
    body += textwrap.dedent("""
        def loss(outputs, targets):
            return ((outputs - targets) ** 2).mean()

        def metrics(outputs, targets):
            return {"mae": float((outputs - targets).abs().mean())}
        """)
    task = load_task({"task": write_task(tmp_path, body, "regression2.py")})
    assert not task.classification and task.num_classes is None and task.y_train.dtype == np.float32
    assert set(task.metrics(torch.zeros(3, 1), torch.ones(3, 1))) == {"mae"}


def test_exception_lines_quote_the_task_file(tmp_path):
    path = write_task(tmp_path, "def model():\n    return 1 / 0\n", "boom.py")
    namespace: dict = {}
    exec(compile(open(path).read(), path, "exec"), namespace)
    try:
        namespace["model"]()
    except ZeroDivisionError as error:
        text = describe_exception(error, path)
    assert text.startswith("ZeroDivisionError") and f"{path}, line 2: return 1 / 0" in text


BAD_TASKS = [
    ("no_model", "def data():\n    return {}\n", "defines no model()"),
    ("no_data", "from torch import nn\ndef model():\n    return nn.Linear(2, 2)\n", "defines no data()"),
    ("model_value", GOOD + "\nmodel = 3\n", "model must be a function"),
    ("import_error", "import no_such_package_here\n" + GOOD, "importing it failed: ModuleNotFoundError"),
    ("syntax_error", GOOD + "\ndef broken(:\n", "SyntaxError"),
    ("model_not_module", GOOD + "\ndef model():\n    return 'a model'\n", "must return a torch.nn.Module"),
    (
        "model_raises",
        GOOD + "\ndef model():\n    raise RuntimeError('no weights here')\n",
        "line 17: raise RuntimeError",
    ),
    ("data_raises", GOOD + "\ndef data():\n    return open('/no/such/file.csv')\n", "data() raised FileNotFoundError"),
    ("data_list", GOOD + "\ndef data():\n    return [1, 2, 3]\n", "must return a dict"),
    ("missing_key", GOOD.replace('"y_test": y[40:],', ""), "returned no y_test"),
    ("unknown_key", GOOD.replace('"owner_train"', '"owners"'), "unknown keys ['owners']"),
    ("lengths", GOOD.replace('"y_train": y[:40]', '"y_train": y[:39]'), "x_train has 40 samples but y_train has 39"),
    (
        "nan_inputs",
        GOOD.replace("x = rng.normal(size=(60, 4))", "x = rng.normal(size=(60, 4)); x[7, 2] = np.nan"),
        "NaN or infinite values (first in row 7)",
    ),
    ("labels_outside", GOOD.replace("nn.Linear(16, 3)", "nn.Linear(16, 2)"), "holds class 2 but the model outputs 2"),
    ("negative_labels", GOOD.replace('"y_train": y[:40]', '"y_train": y[:40] - 1'), "negative class ids"),
    (
        "loss_not_scalar",
        GOOD + "\nimport torch.nn.functional as F\ndef loss(outputs, targets):\n"
        "    return F.cross_entropy(outputs, targets, reduction='none')\n",
        "must return a scalar tensor",
    ),
    ("forward_fails", GOOD.replace("nn.Linear(4, 16)", "nn.Linear(7, 16)"), "the model failed on 8 training samples"),
    ("metrics_not_dict", GOOD + "\ndef metrics(outputs, targets):\n    return 0.5\n", "must return a dict of floats"),
    ("metric_named_loss", GOOD + "\ndef metrics(outputs, targets):\n    return {'loss': 1.0}\n", "is taken"),
    ("test_shape", GOOD.replace('"x_test": x[40:]', '"x_test": x[40:, :3]'), "same sample shape"),
    ("owner_length", GOOD.replace("np.arange(40) // 4", "np.arange(30)"), "owner_train has 30 entries"),
    ("string_inputs", GOOD.replace('"x_train": x[:40]', '"x_train": x[:40].astype(str)'), "has dtype <U"),
    ("empty", GOOD.replace('"x_train": x[:40], "y_train": y[:40]', '"x_train": x[:0], "y_train": y[:0]'), "is empty"),
    ("no_parameters", GOOD + "\ndef model():\n    return nn.ReLU()\n", "without trainable floating-point parameters"),
    (
        "augment_shape",
        GOOD + "\ndef augment(inputs, generator):\n    return inputs[:, :2]\n",
        "augment(inputs, generator)",
    ),
    ("prepare_rows", GOOD + "\ndef prepare(x):\n    return x[:1]\n", "prepare(x) must return a tensor with the same"),
    (
        "loss_detached",
        GOOD + "\nimport torch\ndef loss(outputs, targets):\n    return torch.tensor(1.0)\n",
        "does not depend on the model's outputs",
    ),
]


@pytest.mark.parametrize("name, body, needle", BAD_TASKS, ids=[case[0] for case in BAD_TASKS])
def test_every_bad_task_gets_one_line_naming_the_file_and_the_problem(tmp_path, name, body, needle):
    path = write_task(tmp_path, body, f"{name}.py")
    with pytest.raises(TaskError) as caught:
        load_task({"task": path})
    message = str(caught.value)
    assert message.startswith(f"task {path}: ") and "\n" not in message
    assert needle in message, message


def test_missing_files_and_modules_are_named(tmp_path):
    with pytest.raises(TaskError, match="no such file"):
        load_hooks(str(tmp_path / "nope.py"))
    with pytest.raises(TaskError, match="no module 'no_such_pkg.tasks'"):
        load_hooks("no_such_pkg.tasks")
    with pytest.raises(TaskError, match="--task needs a file path"):
        load_hooks("  ")


def test_the_job_refuses_a_bad_task_before_anything_starts(tmp_path):
    """One line on stderr (no traceback), exit status 2, in seconds: no NVFlare process was started."""
    bad = write_task(tmp_path, BAD_TASKS[13][1], "labels.py")
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", "pt_job_fedavg.py"), "--task", bad],
        cwd=tmp_path,
        env=isolated_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert f"task {bad}" in last and "holds class 2" in last
    assert not (tmp_path / "workspace" / "nvflare").exists()
