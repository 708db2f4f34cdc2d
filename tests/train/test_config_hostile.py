"""Hostile config files: alias bombs, deep nesting, huge integers and NaN are one-line errors (issue 24)."""

from __future__ import annotations

import pytest

from trace_train.config_loader import MAX_YAML_DEPTH, MAX_YAML_NODES, load_config, safe_load
from trace_train.train import TrainConfig

from .test_config import Demo


def _bomb(levels: int = 9, width: int = 10) -> str:
    """A "billion laughs" document: ``width ** levels`` values once its aliases are expanded."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\ntags: {{bomb: *l{levels - 1}}}\n"


def test_an_alias_bomb_is_refused_before_it_is_walked(tmp_path):
    preset = tmp_path / "bomb.yaml"
    preset.write_text("steps: 3\n" + _bomb())
    with pytest.raises(ValueError, match=rf"bomb.yaml: not valid YAML: the document expands to more than "
                                         rf"{MAX_YAML_NODES} values \(aliases expanded\)$"):
        load_config(Demo, preset)
    with pytest.raises(ValueError, match="^override 'tags=.*expands to more than"):
        load_config(Demo, None, ["tags=" + _bomb(7).replace("\n", ", ").join("{}")])


def test_ordinary_aliases_still_work_and_recursive_ones_do_not(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("name: &n run-a\ntags: {who: *n, all: &all [1, 2]}\noptim: {betas: *all}\n")
    cfg = load_config(Demo, preset)
    assert cfg.tags == {"who": "run-a", "all": [1, 2]} and cfg.optim.betas == (1.0, 2.0)
    preset.write_text("tags: &t {me: *t}\n")
    with pytest.raises(ValueError, match="p.yaml: not valid YAML: a recursive alias"):
        load_config(Demo, preset)


@pytest.mark.parametrize("depth", [MAX_YAML_DEPTH + 1, 100_000])
def test_deep_nesting_is_refused(tmp_path, depth):
    preset = tmp_path / "deep.yaml"
    preset.write_text("tags: {x: " + "[" * depth + "]" * depth + "}\n")
    with pytest.raises(ValueError, match=rf"deep.yaml: not valid YAML: .*nest.* deeper than {MAX_YAML_DEPTH}"):
        load_config(Demo, preset)


@pytest.mark.parametrize("override, message", [
    ("steps=9223372036854775808", r"`steps` must be a 64-bit integer \(\|value\| < 2\*\*63\), got one with 19 "),
    ("steps=-9223372036854775809", "`steps` must be a 64-bit integer"),
    ("steps=" + "9" * 5000, r"override 'steps=999.*: not valid YAML: Exceeds the limit \(4300 digits\)"),
    ("optim.lr=.nan", r"`optim.lr` must be a finite number, got nan"),
    ("optim.lr=nan", r"`optim.lr` must be a finite number, got nan"),
    ("optim.lr=.inf", r"`optim.lr` must be a finite number, got inf"),
    ("optim.lr=" + "1" * 400, r"`optim.lr` must be a finite number"),
    ("optim.betas=[0.9, .nan]", r"`optim.betas\[1\]` must be a finite number, got nan"),
])
def test_huge_integers_and_non_finite_numbers_are_refused(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(Demo, None, [override])


@pytest.mark.parametrize("override, field", [("seed=99999999999999999999", "seed"), ("optim.lr=-.inf", "optim.lr"),
                                             ("rollout.roots=99999999999999999999", "rollout.roots")])
def test_the_trainers_config_refuses_them_naming_the_field(override, field):
    with pytest.raises(ValueError, match=rf"`{field}` must be"):
        load_config(TrainConfig, "cpu_demo", [override])


def test_safe_load_reads_ordinary_yaml():
    assert safe_load("a: [1, 2.5, {b: null}]", "x") == {"a": [1, 2.5, {"b": None}]}
    with pytest.raises(ValueError, match=r"^x, line 1: not valid YAML"):
        safe_load("a: [", "x")


@pytest.mark.parametrize("override, message", [
    ("rollout.token_budget=1000000000000", r"`token_budget` 1000000000000 is more than a step can hold: at 64 bytes "
                                           r"a token, 1024 GiB holds at most 17179869184 tokens"),
    ("rollout.roots=1099511627776", r"`roots` 1099511627776 is more than a step can hold: .* at most 8388608 roots"),
    ("predictor.n_buckets=1099511627776", r"`n_buckets` 1099511627776 is too many: .* at most 2\^30"),
    # issue 52, item 7: a context limit no root fits in names that field, not "at most 0 roots"
    ("rollout.limits.max_context_tokens=1000000000000000", r"^rollout: `limits.max_context_tokens` 1000000000000000 is more "
     r"than a step can hold: one root's 2 rollouts .* at most 8589934592 tokens$"),
])
def test_budgets_and_sizes_past_what_memory_holds_are_one_line(override, message):
    """Issue 34: 10^12 tokens or 2^40 roots or buckets fail when the config is read, not hours later."""
    with pytest.raises(ValueError, match=message):
        load_config(TrainConfig, "cpu_demo", [override])
    load_config(TrainConfig, "cpu_demo", ["rollout.token_budget=100000", "predictor.n_buckets=1048576"])
