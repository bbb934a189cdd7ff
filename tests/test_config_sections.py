"""Settings by concern: every field belongs to one section defined beside its code, ``--help`` groups flags by
section, presets are written by section (a flat one still loads), and the Python API takes settings by section."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from devsim import config as config_module
from devsim.config import AsyncConfig, ClusterConfig, ConfigError, FedReviveConfig, SimulationConfig
from devsim.sections import SECTIONS, flatten_sections, section_fields
from devsim_flare.api import RECIPES, FedAvgRecipe, FedReviveRecipe, RecipeError
from devsim_flare.api.errors import RaisingParser
from devsim_flare.cli import PRESETS_DIR, build_parser, load_preset

CONFIGS = (SimulationConfig, AsyncConfig, ClusterConfig, FedReviveConfig)


def _defining_classes(config_cls: type) -> dict[str, list[type]]:
    """Field name -> the classes in ``config_cls``'s MRO that annotate it (define it)."""
    owners: dict[str, list[type]] = {}
    for cls in config_cls.__mro__:
        for name in cls.__dict__.get("__annotations__", {}):
            owners.setdefault(name, []).append(cls)
    return owners


@pytest.mark.parametrize("config_cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_is_defined_once_in_a_section_module_not_in_config(config_cls):
    owners = _defining_classes(config_cls)
    for f in dataclasses.fields(config_cls):
        assert f.metadata["section"] in SECTIONS, f.name
        assert len(owners[f.name]) == 1, f"{f.name} is defined in {owners[f.name]}"
        (owner,) = owners[f.name]
        assert owner.__module__ != config_module.__name__, f"{f.name} is defined in devsim.config"
        assert owner.__module__.endswith(".settings"), f"{f.name} lives in {owner.__module__}"


def test_each_section_is_defined_beside_its_code():
    homes: dict[str, set[str]] = {}
    for config_cls in (ClusterConfig, FedReviveConfig):
        owners = _defining_classes(config_cls)
        for f in dataclasses.fields(config_cls):
            homes.setdefault(f.metadata["section"], set()).add(owners[f.name][0].__module__)
    single = {section: modules.pop() for section, modules in homes.items() if len(modules) == 1}
    assert single == {
        "data": "devsim.data.settings",
        "population": "devsim.population.settings",
        "clock": "devsim.clock.settings",
        "training": "devsim.training.settings",
        "aggregation": "devsim.aggregation.settings",
        "compression": "devsim.compression.settings",
        "observation": "devsim.observe.settings",
        "environment": "devsim.resources.settings",
        "privacy": "devsim.privacy.settings",
        "cluster": "devsim.aggregation.settings",
        "fedrevive": "devsim.aggregation.settings",
    }


def test_a_configuration_reads_and_loads_by_section():
    config = FedReviveConfig(lr=0.01, concurrency=7, kd_iterations=3)
    sections = config.to_sections()
    assert list(sections) == [key for key in SECTIONS if key != "cluster"]
    assert sections["training"]["lr"] == 0.01
    assert sections["population"]["concurrency"] == 7
    assert sections["fedrevive"]["kd_iterations"] == 3
    assert FedReviveConfig.from_dict(sections) == config
    assert FedReviveConfig.from_dict(config.to_dict()) == config


def test_a_setting_in_the_wrong_section_is_refused_in_one_line_naming_its_section():
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_dict({"training": {"num_leaf_nodes": 4}})
    message = str(info.value)
    assert "\n" not in message
    assert message == "--num-leaf-nodes: belongs in section 'population' (population.num_leaf_nodes), not 'training'"
    with pytest.raises(ConfigError, match="--lr: is given twice"):
        flatten_sections({"lr": 0.1, "training": {"lr": 0.2}}, SimulationConfig)
    with pytest.raises(ConfigError, match="section 'training' must map setting names to values"):
        SimulationConfig.from_dict({"training": 0.1})


def test_section_checks_still_name_the_flag():
    with pytest.raises(ConfigError, match="--concurrency: 500 is larger than the population"):
        AsyncConfig(concurrency=500).validate()
    with pytest.raises(ConfigError, match="--topk-momentum: 0.5 is not allowed in asynchronous runs"):
        AsyncConfig(update_codec="topk", topk_momentum=0.5).validate()
    with pytest.raises(ConfigError, match=r"--tau: 1.5 is outside the allowed range \[0, 1\]"):
        ClusterConfig(tau=1.5).validate()
    with pytest.raises(ConfigError, match="--distill-lag: -1 is below the minimum of 0"):
        FedReviveConfig(distill_lag=-1).validate()


@pytest.mark.parametrize("method", sorted(RECIPES))
def test_help_groups_every_flag_by_its_section(method):
    recipe = RECIPES[method]
    parser = build_parser("", recipe.defaults)
    config_cls = type(recipe.defaults)
    groups = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    expected = [SECTIONS[key] for key in section_fields(config_cls)]
    titles = [g.title for g in parser._action_groups if g.title in SECTIONS.values()]
    assert titles == expected
    assert "run" in groups and "simulation" not in groups
    for f in dataclasses.fields(config_cls):
        shown = not f.metadata.get("internal") and not (
            issubclass(config_cls, AsyncConfig) and f.metadata.get("sync_only")
        )
        assert (f.name in groups[SECTIONS[f.metadata["section"]]]) == shown, f.name
    text = parser.format_help()
    assert text.index("task and data:") < text.index("  --dataset") < text.index("training:") < text.index("  --lr ")


def test_shipped_presets_are_written_by_section():
    for name in sorted(f for f in os.listdir(PRESETS_DIR) if f.endswith(".json")):
        with open(os.path.join(PRESETS_DIR, name), encoding="utf-8") as stream:
            values = json.load(stream)
        assert set(values) - {"description"} <= set(SECTIONS), name


def test_an_old_flat_preset_loads_the_same_values_as_its_sectioned_form(tmp_path):
    sectioned = load_preset(RaisingParser(), "fedrevive_small_cpu", FedReviveConfig)
    with open(os.path.join(PRESETS_DIR, "fedrevive_small_cpu.json"), encoding="utf-8") as stream:
        values = json.load(stream)
    flat = {"description": values.pop("description")}
    for section in values.values():
        flat.update(section)
    path = tmp_path / "old_flat.json"
    path.write_text(json.dumps(flat))
    assert load_preset(RaisingParser(), str(path), FedReviveConfig) == sectioned
    assert sectioned["kd_interval"] == 5 and sectioned["delay_schedule"] == "paper_shifted"


def test_a_preset_with_a_misplaced_setting_fails_in_one_line_naming_the_new_key(tmp_path, capsys):
    path = tmp_path / "misplaced.json"
    path.write_text(json.dumps({"training": {"lr": 0.1, "concurrency": 4}}))
    with pytest.raises(RecipeError) as info:
        load_preset(RaisingParser(), str(path), AsyncConfig)
    assert str(info.value) == (
        f"--preset {path}: --concurrency: belongs in section 'population' (population.concurrency), not 'training'"
    )
    with pytest.raises(SystemExit):
        load_preset(build_parser("", AsyncConfig()), str(path), AsyncConfig)
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and "population.concurrency" in error_lines[0]


def test_the_python_api_takes_settings_by_section():
    recipe = FedAvgRecipe(training={"lr": 0.01, "batch_size": 5}, population={"num_leaf_nodes": 3}, num_rounds=2)
    config = recipe.config()
    assert (config["lr"], config["batch_size"], config["num_leaf_nodes"], config["num_rounds"]) == (0.01, 5, 3, 2)
    assert config["momentum"] == SimulationConfig().momentum
    revive = FedReviveRecipe(fedrevive={"kd_iterations": 2}).config()
    assert revive["kd_iterations"] == 2 and revive["generator_width"] == FedReviveRecipe.defaults.generator_width
    with pytest.raises(RecipeError, match=r"FedAvgRecipe: --lr: belongs in section 'training' \(training.lr\)"):
        FedAvgRecipe(data={"lr": 0.01})
    with pytest.raises(RecipeError, match="no setting 'kd_iterations' for the fedavg job"):
        FedAvgRecipe(fedrevive={"kd_iterations": 2})


def test_the_configuration_imports_no_pytorch():
    import subprocess
    import sys

    code = "import sys, devsim.config; print(sorted(m for m in ('torch', 'nvflare') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_an_async_population_smaller_than_the_sync_selection_default_is_allowed():
    """Asynchronous jobs have no --device-selection-size flag, so its default (20) is not held against their
    population: FedBuff on 2 leaves x 5 devices with K = 4 is a valid run (it was refused naming that flag)."""
    AsyncConfig.from_dict({"devices_per_leaf": 5, "concurrency": 4})
    FedReviveConfig.from_dict({"devices_per_leaf": 5, "concurrency": 4})
    with pytest.raises(ConfigError, match=r"--concurrency: 20 is larger than the population of 10 devices \(--num"):
        AsyncConfig.from_dict({"devices_per_leaf": 5})
    with pytest.raises(ConfigError, match="--device-selection-size: 20 is larger than the population of 10"):
        SimulationConfig.from_dict({"devices_per_leaf": 5})


@pytest.mark.parametrize(
    "config, argv, hint",
    [
        (SimulationConfig(), ["--dp-clip-norm", "1.0"], "; --dp-clip-norm: did you mean --dp-clip-lr or --dp-clip?"),
        (
            SimulationConfig(),
            ["--samples_per_device", "3"],
            "; --samples_per_device: did you mean --samples-per-device?",
        ),
        (AsyncConfig(), ["--num-rounds", "5"], "; --num-rounds is for synchronous rounds only (pt_job_fedavg.py, "),
        (AsyncConfig(), ["--num-round=5"], "; --num-round: did you mean --num-rounds? It is for synchronous rounds"),
        (SimulationConfig(), ["--zzz", "3"], "unrecognized arguments: --zzz 3"),
    ],
)
def test_an_unknown_flag_is_refused_naming_what_was_meant(config, argv, hint, capsys):
    with pytest.raises(SystemExit):
        build_parser("", config).parse_args(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert hint in last and last.count("unrecognized arguments") == 1, last
