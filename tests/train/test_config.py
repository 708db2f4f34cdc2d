"""Config loading: presets, overrides, type checks and clear errors."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from trace_train.config import config_from_dict, config_to_dict, fingerprint, load_config


@dataclass(frozen=True)
class Optim:
    lr: float = 1e-5
    betas: tuple[float, ...] = (0.9, 0.999)

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"`lr` must be positive, got {self.lr!r}")


@dataclass(frozen=True)
class Demo:
    name: str = "run"
    steps: int = 10
    policy: Literal["grpo", "trace"] = "trace"
    cap: int | None = None
    optim: Optim = field(default_factory=Optim)
    tags: dict = field(default_factory=dict)


def test_preset_file_and_overrides(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("steps: 3\noptim:\n  lr: 1e-3\n")  # PyYAML reads 1e-3 as a string
    cfg = load_config(Demo, preset, ["optim.lr=3e-5", "cap=4", "policy=grpo", "optim.betas=[0.8, 0.9]", "tags={a: 1}"])
    assert cfg == Demo(steps=3, policy="grpo", cap=4, optim=Optim(lr=3e-5, betas=(0.8, 0.9)), tags={"a": 1})
    assert load_config(Demo, preset, ["cap=null"]).cap is None
    assert config_to_dict(cfg)["optim"]["betas"] == [0.8, 0.9]
    assert fingerprint(cfg) == fingerprint(load_config(Demo, preset, ["optim.lr=3e-5", "cap=4", "policy=grpo",
                                                                      "optim.betas=[0.8, 0.9]", "tags={a: 1}"]))
    assert fingerprint(cfg) != fingerprint(Demo())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["stpes=3"], r"unknown config key 'stpes'; did you mean 'steps'\?"),
        (["optim.learning=1"], r"unknown config key 'optim.learning'; known keys here: lr, betas"),
        (["steps=many"], r"`steps` must be an integer, got 'many'"),
        (["steps=2.5"], r"`steps` must be an integer, got 2.5"),
        (["policy=dapo"], r"`policy` must be one of \['grpo', 'trace'\], got 'dapo'"),
        (["optim=3"], r"`optim` must be a section \(a mapping\), got 3"),
        (["optim.lr=-1"], r"optim: `lr` must be positive, got -1.0"),
        (["optim.betas=0.9"], r"`optim.betas` must be a list, got 0.9"),
        (["cap=abc"], r"`cap` must be an integer, got 'abc'"),
        (["steps"], r"override 'steps' must look like dotted.key=value"),
        (["steps.x=1"], r"override 'steps.x=1': 'steps' is a value, not a section"),
    ],
)
def test_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(Demo, None, ["steps=1", *overrides] if overrides[0].startswith("steps.") else overrides)


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"no preset 'nope'; presets: "):
        load_config(Demo, "nope")


def test_from_dict_requires_mappings():
    with pytest.raises(ValueError, match=r"`optim.lr` must be a number, got 'x'"):
        config_from_dict(Demo, {"optim": {"lr": "x"}})


def test_every_shipped_preset_is_a_valid_training_config():
    from trace_train.config import available_presets
    from trace_train.train import TrainConfig

    presets = available_presets()
    assert "cpu_demo" in presets and "gpu_smoke" in presets
    for name in presets:
        cfg = load_config(TrainConfig, name)
        assert cfg.steps > 0 and cfg.run_dir
