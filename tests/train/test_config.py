"""Config loading: presets, overrides, type checks and clear errors."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from trace_train.config_loader import config_from_dict, config_to_dict, fingerprint, load_config


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
    from trace_train.config_loader import available_presets
    from trace_train.train import TrainConfig

    presets = available_presets()
    assert "cpu_demo" in presets and "gpu_smoke" in presets
    for name in presets:
        cfg = load_config(TrainConfig, name)
        assert cfg.steps > 0 and cfg.run_dir


# ---------------------------------------------------------------------------------------------------
# The trainer's config: validated once, every field documented in --help, resolved by --print-config
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("rollout.roots=0", "rollout: `roots` must be at least 1 (M bare rollouts per step), got 0"),
    ("optim.lr=inf", "`optim.lr` must be a finite number, got inf"),
    ("optim.lr=nan", "`optim.lr` must be a finite number, got nan"),
    ("rollout.pool_size=0", "rollout: `pool_size` must be a positive integer, got 0"),
    ("rollout.max_turns=3", "config key 'rollout.max_turns' is now 'rollout.limits.max_turns'"),
    ("rollout.limits.max_turns=0", "rollout.limits: `max_turns` must be a positive integer, got 0"),
    ("backend.prefix_cache_bytes=-1", "backend: `prefix_cache_bytes` must be a whole number of bytes, at least 0 "
                                      "(0 turns the transformers back end's prefix cache off), got -1"),
])
def test_impossible_training_configs_are_refused(override, message):
    from trace_train.configs import TrainConfig

    with pytest.raises(ValueError) as error:
        load_config(TrainConfig, "cpu_demo", [override])
    assert str(error.value) == message


def _leaves(cls, prefix=""):
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def test_help_lists_every_field_with_type_default_and_meaning():
    import subprocess
    import sys

    from trace_train.configs import TrainConfig

    out = subprocess.run([sys.executable, "-m", "trace_train.train", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    keys = list(_leaves(TrainConfig))
    assert len(keys) > 60 and "rollout.limits.max_turns" in keys and "rollout.dapo_target" in keys
    for key in keys:
        at = [i for i, line in enumerate(lines) if line.startswith(f"  {key}: ")]
        assert len(at) == 1, key
        assert " = " in lines[at[0]], lines[at[0]]  # type = default
        assert lines[at[0] + 1].startswith("      ") and len(lines[at[0] + 1].strip()) > 5, key  # its meaning
    assert "  optim.lr: float = 0.001" in lines and "[rollout.limits: " in out.stdout


def test_print_config_prints_the_resolved_preset_plus_overrides():
    import subprocess
    import sys

    import yaml

    from trace_train.configs import TrainConfig

    out = subprocess.run([sys.executable, "-m", "trace_train.train", "--config", "cpu_demo", "--print-config",
                          "rollout.policy=grpo", "optim.lr=3e-5"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)
    assert printed == config_to_dict(load_config(TrainConfig, "cpu_demo", ["rollout.policy=grpo", "optim.lr=3e-5"]))
    assert printed["rollout"]["policy"] == "grpo" and printed["rollout"]["limits"]["max_turns"] == 3
    assert config_from_dict(TrainConfig, printed) == load_config(TrainConfig, "cpu_demo", ["rollout.policy=grpo",
                                                                                            "optim.lr=3e-5"])


def test_no_config_field_is_defined_twice():
    """The trainer's sections and the engine's config share no field: the rollout section is the engine's."""
    from trace_train import configs
    from trace_train.rollout.engine import RolloutConfig

    assert configs.TrainConfig.__dataclass_fields__["rollout"].type in ("RolloutConfig", RolloutConfig)
    assert not hasattr(configs, "RolloutSettings")
    import trace_train.train as train

    assert not [name for name, value in vars(train).items()
                if isinstance(value, type) and name.endswith("Config") and value.__module__ == train.__name__]


def test_a_config_saved_before_predictor_seed_was_removed_still_loads_and_resumes(tmp_path):
    """``predictor.seed`` was never used: a saved config.yaml that sets it loads (the key is ignored), and the
    resume fingerprint is the one such a run stored in its checkpoints."""
    import yaml

    from trace_train.configs import PredictorConfig, TrainConfig
    from trace_train.predictors import build_predictor, predictor_from_state_dict
    from trace_train.run.resume import resume_fingerprint

    saved = config_to_dict(load_config(TrainConfig, "cpu_demo"))
    saved["predictor"]["seed"] = 0
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    assert load_config(TrainConfig, path) == load_config(TrainConfig, "cpu_demo")
    assert not hasattr(PredictorConfig(), "seed")
    streamed = load_config(TrainConfig, None, ["rollout.expansion=streamed"])  # the default of those runs
    assert resume_fingerprint(streamed) == "23bb254bc7ce58df"  # the value before the removal
    state = build_predictor().state_dict()
    state["config"]["seed"] = 0  # a predictor saved before the removal
    assert predictor_from_state_dict(state).config == PredictorConfig()


def test_a_field_added_later_keeps_older_fingerprints_at_its_default():
    """``predictor.probe_step`` came after checkpoints existed: at its default the resume fingerprint is the
    one older runs stored; another value is another trajectory and another fingerprint."""
    from trace_train.configs import TrainConfig
    from trace_train.run.resume import resume_fingerprint

    streamed = ["rollout.expansion=streamed"]  # every run before had it (its default changed since)
    assert resume_fingerprint(load_config(TrainConfig, None, streamed)) == "23bb254bc7ce58df"
    assert resume_fingerprint(load_config(TrainConfig, None, [*streamed, "predictor.probe_step=0.5"])) \
        != "23bb254bc7ce58df"


def test_the_eager_lag_default_change_leaves_other_runs_resuming_and_names_the_fix_for_eager_ones(tmp_path):
    """``rollout.eager_lag``'s default went from 1 to 0 (round 14). A run of another expansion stored lag 1
    (it never read it): its directory and fingerprint still match. An eager run started at lag 1 is another
    trajectory: refused, the refusal naming the override that resumes it, which then matches."""
    import dataclasses

    import yaml

    from trace_train.configs import TrainConfig
    from trace_train.run.resume import check_or_write_config, resume_fingerprint

    def stored(run_dir, cfg, lag):
        run_dir.mkdir()
        data = config_to_dict(cfg)
        data["rollout"]["eager_lag"] = lag  # as a run before round 14 wrote it
        (run_dir / "config.yaml").write_text(yaml.safe_dump(data))
        return run_dir

    # cpu_demo's games as round 13 had them (its rows changed since, for the held-out prompt split)
    grpo = load_config(TrainConfig, "cpu_demo", ["rollout.policy=grpo", "task.rows={low: 1, high: 6, max_guesses: 3}"])
    assert grpo.rollout.eager_lag == 0
    check_or_write_config(grpo, stored(tmp_path / "grpo", grpo, 1))  # resumes
    lag1 = dataclasses.replace(grpo, rollout=dataclasses.replace(grpo.rollout, eager_lag=1))
    assert resume_fingerprint(grpo) == resume_fingerprint(lag1) == "c47b04860ebc23de"  # round 13's code's value

    eager = load_config(TrainConfig, "cpu_demo", ["rollout.expansion=eager", "task.rows={low: 1, high: 6, max_guesses: 3}"])
    with pytest.raises(ValueError, match=r"differs in rollout\.eager_lag\).*default changed from 1 to 0 in "
                                         r"round 14: add rollout\.eager_lag=1 to resume this run"):
        check_or_write_config(eager, stored(tmp_path / "eager", eager, 1))
    old = load_config(TrainConfig, "cpu_demo", ["rollout.expansion=eager", "rollout.eager_lag=1",
                                                "task.rows={low: 1, high: 6, max_guesses: 3}"])
    check_or_write_config(old, tmp_path / "eager")
    assert resume_fingerprint(old) == "a880684dc582b1fa" != resume_fingerprint(eager)  # round 13's value at lag 1


def test_the_expansion_default_change_refuses_older_trace_runs_with_the_fix_and_resumes_the_rest(tmp_path):
    """``rollout.expansion``'s default went from "streamed" to "eager" (2026-12-07). A TRACE run started
    before is another trajectory under the new default: refused, the refusal naming the one field that
    differs and the override that resumes it (the eager-only fields are no second difference), which then
    matches its stored fingerprint.
    A config written before the field existed is read as streamed, never as today's eager. A GRPO run never
    read the field: it resumes as it is, at its old fingerprint."""
    import yaml

    from trace_train.configs import TrainConfig
    from trace_train.run.resume import check_or_write_config, resume_fingerprint

    rows = "task.rows={low: 1, high: 6, max_guesses: 3}"  # cpu_demo's games as the fingerprints had them

    def stored(name, cfg, drop=()):
        run_dir = tmp_path / name
        run_dir.mkdir()
        data = config_to_dict(cfg)
        data["rollout"].update(expansion="streamed", eager_lag=1)  # as a run before the change wrote it
        for key in drop:
            del data["rollout"][key]
        (run_dir / "config.yaml").write_text(yaml.safe_dump(data))
        return run_dir

    trace = load_config(TrainConfig, "cpu_demo", [rows])
    assert trace.rollout.expansion == "eager"
    for name, drop in (("streamed", ()), ("before_the_field", ("expansion", "eager_reserve", "eager_lag"))):
        run_dir = stored(name, trace, drop)
        refusal = (r"differs in rollout\.expansion\); .*rollout\.expansion's default "
                   r"changed from 'streamed' to 'eager' in 2026-12-07: add rollout\.expansion=streamed to "
                   r"resume this run$")
        with pytest.raises(ValueError, match=refusal):
            check_or_write_config(trace, run_dir, write=False)
        resumed = load_config(TrainConfig, "cpu_demo", [rows, "rollout.expansion=streamed"])
        check_or_write_config(resumed, run_dir, write=False)
    assert resume_fingerprint(resumed) == "859ec8577d8f8937" != resume_fingerprint(trace)  # the value before

    grpo = load_config(TrainConfig, "cpu_demo", ["rollout.policy=grpo", rows])
    check_or_write_config(grpo, stored("grpo", grpo), write=False)
    assert resume_fingerprint(grpo) == "c47b04860ebc23de"  # the value before the change
