"""Messages that used to mislead by a little (issue 54): each names exactly what is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trace_train import train
from trace_train.config_loader import load_config
from trace_train.configs import TrainConfig
from trace_train.data.loading import load_rows
from trace_train.tasks import build_task

REPO = Path(__file__).resolve().parents[2]


def test_a_task_class_missing_one_method_is_told_that_method(tmp_path):
    source = (REPO / "examples" / "parity_game" / "parity_env.py").read_text()
    without = re.sub(r"\n    def restore\(self.*?(?=\n\S|\Z)", "\n", source, flags=re.S)
    assert "def restore" not in without and "def snapshot" in without
    (tmp_path / "env.py").write_text(without)
    cfg = load_config(TrainConfig, None, [f"task.name={tmp_path / 'env.py'}:ParityEnv",
                                          f"task.train={REPO / 'examples' / 'parity_game' / 'rows.jsonl'}"])
    with pytest.raises(ValueError) as err:
        build_task(cfg.task, seed=0)
    assert "lacks the Environment method restore (" in str(err.value), str(err.value)
    assert "method reset" not in str(err.value) and "methods" not in str(err.value).split("(")[0]


def test_a_bad_jsonl_line_names_its_line_without_the_parsers_own_line_count(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"a": 2,, }\n')
    with pytest.raises(ValueError) as err:
        load_rows(path)
    assert str(err.value) == f"{path}, line 2: not valid JSON (Expecting property name enclosed in double quotes at column 9)"


@pytest.mark.parametrize("key, meant", [("optim.lrr", "optim.lr"), ("lr", "optim.lr"), ("rollout.polcy", "rollout.policy"),
                                        ("stpes", "steps")])
def test_did_you_mean_names_the_full_dotted_key(key, meant, capsys):
    assert train.cli([f"{key}=1"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"did you mean {meant!r}?")
