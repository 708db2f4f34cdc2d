"""The math recipe composes into a config verl 0.9.1 accepts, and its parts work on CPU: the trainer and
manager it names load, the Python tool runs code and keeps its session in the trajectory, the reward scores
answers, and the data preparation writes verl's columns. (Training it needs the GPU node.)"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from trace_train.integrations.verl import VERL_VERSION

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "trace_train", "integrations", "verl")


@pytest.fixture(scope="module")
def recipe(verl):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.abspath(HERE), version_base=None):
        return compose(config_name="recipe_math_qwen3_8b")


def test_the_recipe_is_a_verl_config_that_names_trace_everywhere(recipe):
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import load_class_from_fqn

    from trace_train.integrations.verl.trainer import TracePPOTrainer, TraceSettings
    from trace_train.integrations.verl.worker import TraceAgentLoopManager

    rollout = omega_conf_to_dataclass(recipe.actor_rollout_ref.rollout)  # verl's own schema check
    assert rollout.agent.default_agent_loop == "trace_tool_agent" and rollout.multi_turn.enable
    assert load_class_from_fqn(rollout.agent.agent_loop_manager_class, "AgentLoopManager") is TraceAgentLoopManager
    assert get_trainer_cls(recipe.trainer.v1.trainer_mode) is TracePPOTrainer
    assert get_adv_estimator_fn(recipe.algorithm.adv_estimator).__name__ == "compute_trace_tree_advantage"
    settings = TraceSettings.from_config(recipe.trace)
    assert (settings.roots, settings.continuations_per_root, settings.policy) == (1024, 2, "trace")
    assert settings.rollout_config().allocation_policy.streams_prefixes
    assert recipe.actor_rollout_ref.model.path == "Qwen/Qwen3-8B" and recipe.trainer.n_gpus_per_node == 8
    with pytest.raises(ValueError, match="unknown key"):
        TraceSettings.from_config({"rootz": 3})


def test_the_python_tool_keeps_its_session_in_the_trajectory(recipe, tmp_path):
    from omegaconf import OmegaConf
    from verl.tools.tool_registry import initialize_tools_from_config

    config = OmegaConf.load(os.path.join(HERE, "python_tool.yaml"))
    config.tools[0].config.namespaces = "auto"  # this machine's kernel may refuse namespaces
    path = tmp_path / "tool.yaml"
    OmegaConf.save(config, path)
    (tool,) = initialize_tools_from_config(str(path))

    class Trajectory:  # what verl hands a tool as ``agent_data``: only ``extra_fields`` is read
        extra_fields: dict = {}

    agent = Trajectory()
    agent.extra_fields = {}

    async def calls():
        first, _, _ = await tool.execute("i", {"code": "x = 6 * 7"}, agent_data=agent)
        second, _, _ = await tool.execute("i", {"code": "print(x)"}, agent_data=agent)
        return first, second

    _, second = asyncio.run(calls())
    assert "42" in second.text and agent.extra_fields["trace_python_cells"] == ["x = 6 * 7", "print(x)"]


def test_the_reward_and_the_data_files(tmp_path):
    from trace_train.integrations.verl.math_reward import compute_score
    from trace_train.integrations.verl.prepare_math import rows

    assert compute_score("trace_math", "so <answer>\\frac{1}{2}</answer>", "0.5") == 1.0
    assert compute_score("trace_math", "so <answer>3</answer>", "0.5") == 0.0
    source = tmp_path / "problems.jsonl"
    source.write_text("\n".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(3)))
    out = rows(str(source), "train")
    assert len(out) == 3 and out[1]["reward_model"] == {"style": "rule", "ground_truth": "2"}
    assert [m["role"] for m in out[0]["prompt"]] == ["system", "user"] and out[0]["agent_name"] == "trace_tool_agent"
    assert VERL_VERSION == "0.9.1"


def test_the_trace_trainer_is_verls_sync_trainer_with_the_recipes_budget(recipe):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from trace_train.integrations.verl.trainer import TracePPOTrainer

    trainer = TracePPOTrainer(recipe)  # the constructor only: the workers need the GPU node
    assert type(trainer.replay_buffer) is ReplayBuffer and trainer.trainer_mode == "sync"
    assert (trainer.trace_budget.roots, trainer.trace_budget.continuations_per_root) == (1024, 2)
    assert trainer.trace_policy.name == "trace" and trainer.predictor.kind == "ngram"
