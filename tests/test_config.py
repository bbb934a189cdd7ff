"""Configuration validation: bad values are refused with the flag named and what is allowed."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsim.config import ConfigError, SimulationConfig


def test_defaults_are_valid():
    SimulationConfig().validate()


@pytest.mark.parametrize(
    "changes, flag, allowed",
    [
        (
            {"device_selection_size": 101, "num_leaf_nodes": 2, "devices_per_leaf": 50},
            "--device-selection-size",
            "1..100",
        ),
        ({"alpha": 0.0}, "--alpha", "> 0"),
        ({"alpha": -1.0}, "--alpha", "> 0"),
        ({"dataset": "mnist"}, "--dataset", "synthetic, digits, cifar10, cifar100"),
        ({"model": "vgg"}, "--model", "cnn, resnet18"),
        ({"num_rounds": 0}, "--num-rounds", "minimum of 1"),
        ({"partition": "shards"}, "--partition", "iid, dirichlet"),
        ({"momentum": 1.0}, "--momentum", "[0, 1)"),
        ({"lr": float("nan")}, "--lr", "> 0"),
        ({"num_workers": 0}, "--num-workers", "minimum of 1"),
        ({"local_iterations": 0}, "--local-iterations", "minimum of 1"),
        ({"dataset": "cifar10"}, "--data-root", "--dataset synthetic"),
        ({"dataset": "cifar10", "data_root": "/nonexistent/cifar"}, "--data-root", "--download"),
        ({"batch_size": "32"}, "--batch-size", "expected int"),
    ],
)
def test_bad_values_name_flag_and_allowed(changes, flag, allowed):
    values = SimulationConfig().to_dict() | changes
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_dict(values)
    assert flag in str(info.value)
    assert allowed in str(info.value)


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="unknown setting"):
        SimulationConfig.from_dict({"num_round": 3})


def test_round_trip_through_dict():
    config = SimulationConfig(num_rounds=3, alpha=0.1)
    assert SimulationConfig.from_dict(config.to_dict()) == config


_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(list(SimulationConfig().to_dict()) + ["bogus"]), _values, max_size=6))
def test_random_configs_validate_or_fail_clearly(changes):
    values = SimulationConfig().to_dict() | changes
    try:
        config = SimulationConfig.from_dict(values)
    except ConfigError as error:
        assert str(error).startswith("--")
    else:
        assert config.device_selection_size <= config.num_devices


def test_every_preset_validates_with_its_job():
    import os

    from devsim.config import AsyncConfig, FedReviveConfig
    from devsim_flare.api.errors import RaisingParser
    from devsim_flare.cli import PRESETS_DIR, load_preset

    job_configs = {"fedrevive": FedReviveConfig, "fedbuff": AsyncConfig, "fedavg": AsyncConfig}
    names = sorted(f[:-5] for f in os.listdir(PRESETS_DIR) if f.endswith(".json"))
    assert names
    for name in names:
        config_cls = job_configs[name.split("_")[0]]
        values = load_preset(RaisingParser(), name, config_cls)
        if values.get("dataset", "synthetic") != "synthetic":
            values["download"] = True
        config_cls.from_dict(values)


_JOB_FLAGS = [
    "--num-rounds",
    "--num-leaf-nodes",
    "--devices-per-leaf",
    "--device-selection-size",
    "--alpha",
    "--lr",
    "--momentum",
    "--batch-size",
    "--model",
    "--dataset",
    "--partition",
    "--concurrency",
    "--buffer-size",
    "--min-open-slots",
    "--max-versions",
    "--max-sim-time",
    "--delay-schedule",
    "--tau",
    "--hidden-groups",
    "--device-dropout",
    "--min-leaves",
    "--inject-faults",
    "--generator-width",
    "--s-max",
    "--num-workers",
]
_JOB_VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "1e9", "nan", "inf", "0.5", "abc", "", "cnn", "cifar10", "nan,shape"]),
    st.integers(-3, 300).map(str),
)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["fedavg", "fedbuff", "fedrevive", "cluster"]),
    st.lists(st.tuples(st.sampled_from(_JOB_FLAGS), _JOB_VALUES), max_size=5),
)
def test_random_job_command_lines_give_a_config_or_a_clear_error(job, flags):
    import contextlib
    import io

    from devsim.config import AsyncConfig, ClusterConfig, FedReviveConfig
    from devsim_flare.cli import build_parser, config_from_args

    defaults = {
        "fedavg": SimulationConfig(),
        "fedbuff": AsyncConfig(),
        "fedrevive": FedReviveConfig(),
        "cluster": ClusterConfig(num_leaf_nodes=6, hidden_groups=2),
    }[job]
    parser = build_parser("fuzz", defaults)
    argv = [part for pair in flags for part in pair]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            config = config_from_args(parser, parser.parse_args(argv))
    except SystemExit as exit_:
        assert exit_.code == 2
        lines = stderr.getvalue().strip().splitlines()
        assert len(lines) <= 2, lines  # the short usage line and the error, not a screen of flags
        assert "error:" in lines[-1] and "--" in lines[-1], lines[-1]
    else:
        assert isinstance(config, type(defaults))


def test_every_job_prints_help():
    import subprocess
    import sys

    from tests.conftest import REPO

    for job in ("pt_job_fedavg.py", "pt_job_fedbuff.py", "pt_job_fedrevive.py", "pt_job_cluster.py"):
        proc = subprocess.run([sys.executable, f"{REPO}/jobs/{job}", "--help"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert "--seed" in proc.stdout and "--export-dir" in proc.stdout and "(default:" in proc.stdout


def test_optional_numeric_flags_can_be_unset():
    from devsim.config import AsyncConfig
    from devsim_flare.cli import build_parser, config_from_args

    parser = build_parser("t", AsyncConfig())
    config = config_from_args(parser, parser.parse_args(["--max-versions", "none", "--max-sim-time", "3"]))
    assert config.max_versions is None and config.max_sim_time == 3.0


def test_the_cuda_switches_are_off_by_default_and_set_process_wide():
    """``--tf32`` and ``--cudnn-benchmark`` reach the config (every process applies them at its start: the server in
    ``start_run``, each leaf in its set-up) and set PyTorch's process-wide flags; off is the default for both."""
    import torch

    from devsim.resources.precision import apply_cudnn_benchmark, apply_tf32
    from devsim_flare.cli import build_parser, config_from_args

    parser = build_parser("t", SimulationConfig())
    default = config_from_args(parser, parser.parse_args([]))
    assert default.tf32 is False and default.cudnn_benchmark is False
    config = config_from_args(parser, parser.parse_args(["--cudnn-benchmark", "--tf32"]))
    assert config.cudnn_benchmark is True and config.to_dict()["cudnn_benchmark"] is True
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        assert apply_cudnn_benchmark(True) == "cuDNN benchmark on" and torch.backends.cudnn.benchmark
        assert apply_tf32(True) == "tf32 on (matmul and cuDNN)" and torch.backends.cuda.matmul.allow_tf32
        apply_cudnn_benchmark(False)
        apply_tf32(False)
        assert not torch.backends.cudnn.benchmark and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_server_threads_default_to_one_beside_the_leaves():
    """A server sharing the machine with its leaves (sim, poc) runs PyTorch on one thread unless told otherwise; on a
    deployment PyTorch keeps its default; 0 threads is refused with the flag named."""
    from devsim_flare.cli import SHARED_HOST_SERVER_THREADS, with_server_threads

    assert SHARED_HOST_SERVER_THREADS == 1
    assert with_server_threads(SimulationConfig(), "sim").server_threads == 1
    assert with_server_threads(SimulationConfig(), "poc").server_threads == 1
    assert with_server_threads(SimulationConfig(), "prod").server_threads is None
    assert with_server_threads(SimulationConfig(server_threads=2), "sim").server_threads == 2
    with pytest.raises(ConfigError, match="--server-threads"):
        SimulationConfig(server_threads=0).validate()
