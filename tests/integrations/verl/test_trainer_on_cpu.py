"""The ``trace`` trainer against verl's own rules, on CPU: the recipe's update sizes as verl computes them,
settings refused before verl starts its workers, a refill's budget, failed trees through the trainer's step,
and the predictor's checkpoint inside verl's own save and resume (the GPU workers' part of a checkpoint is
played by a worker group that writes its folder, the only stand-in)."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from trace_theory import RolloutBudget
from trace_train.integrations.verl.tree_growth import Session, grow_tree

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "trace_train", "integrations", "verl")


def recipe(verl, *overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.abspath(HERE), version_base=None):
        return compose(config_name="recipe_math_qwen3_8b", overrides=list(overrides))


def test_the_recipe_is_one_optimizer_step_without_padding_as_verl_sizes_it(verl):
    from trace_train.integrations.verl.trainer import TracePPOTrainer

    config = recipe(verl)
    trainer = TracePPOTrainer(config)
    trainer.global_steps = 1  # verl asks at each step (the actor updates from step critic_warmup on)
    trajectories = trainer.trace_budget.roots * (1 + trainer.trace_budget.continuations_per_root)
    dp = config.trainer.n_gpus_per_node * config.trainer.nnodes  # FSDP, no sequence parallelism
    multiple = trainer._get_required_batch_multiple(dp)  # verl pads the step's rows up to a multiple of this
    assert trajectories % multiple == 0, f"{trajectories} rows padded to {-(-trajectories // multiple) * multiple}"
    assert trajectories // multiple == 1  # one optimizer step (mini-batch) per training step
    assert config.actor_rollout_ref.rollout.val_kwargs.n == 8  # where verl reads the validation group size


def test_a_predictor_that_cannot_run_in_verl_is_refused_before_the_workers_start(verl):
    from trace_train.integrations.verl.trainer import TracePPOTrainer, TraceSettings

    with pytest.raises(ValueError, match="trace.predictor='probe' cannot run inside verl"):
        TracePPOTrainer(recipe(verl, "trace.predictor=probe"))
    with pytest.raises(ValueError, match="max_failed_share"):
        TraceSettings(max_failed_share=1.5)


def test_the_family_of_a_prompt_is_the_same_in_every_step(verl):
    from trace_train.integrations.verl.worker import prompt_row
    from trace_train.predictors.base import family_of
    from trace_train.rollout.batch import History

    def family(fields):
        return family_of(History(0, prompt_row(fields), 1, (), ()))

    step1 = {"uid": "a", "global_steps": 1, "index": 4, "level": "hard"}
    assert family(step1) == family({**step1, "uid": "b", "global_steps": 2})
    assert family({**step1, "data_source": "trace_math"}) == "trace_math"


def test_a_refill_gets_its_prompts_share_of_the_budget(verl):
    from trace_train.integrations.verl.trainer import submission_budget

    assert submission_budget(RolloutBudget(1024, 2), 4, 256) == RolloutBudget(16, 2)
    assert submission_budget(RolloutBudget(1024, 2), 1, 256) == RolloutBudget(4, 2)
    assert submission_budget(RolloutBudget(6, 2), 1, 256) == RolloutBudget(1, 2)


@pytest.fixture
def local_ray(verl):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def one_turn(reward):
    async def run(start, session_id):
        await asyncio.sleep(0)
        return Session(1, float(reward), [], [0])

    return run


async def broken(start, session_id):
    raise RuntimeError("the sandbox died")


def test_failed_trees_through_the_trainers_step(verl, local_ray, monkeypatch):
    """The batch hook plants a step (and a refill with its share); a tree that fails drops its group and the
    step's fit goes on without it; more failures than ``trace.max_failed_share`` stop the step in one line."""
    from trace_train.integrations.verl.trainer import TracePPOTrainer, openings_of
    from trace_train.integrations.verl.worker import RemoteCoordinator
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils import tensordict_utils as tu

    trainer = TracePPOTrainer(recipe(verl, "trace.roots=8", "trace.continuations_per_root=1", "data.train_batch_size=4",
                                     "trace.predictor=running_mean", "trace.max_failed_share=0.5"))
    trainer.global_steps = 1
    submitted = []
    monkeypatch.setattr(trainer, "_opening_tokens", lambda: None)  # the tokenizer comes with the workers
    monkeypatch.setattr(PPOTrainer, "_submit_batch_to_rollout",  # verl's dispatch to its agent-loop workers
                        lambda self, batch: submitted.append(batch) or len(batch))

    def batch(n):
        raw = np.empty(n, dtype=object)
        raw[:] = [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(n)]
        return tu.get_tensordict({"raw_prompt": raw, "uid": np.array([f"p{i}" for i in range(n)], dtype=object),
                                  "data_source": np.array(["trace_math"] * n, dtype=object)})

    trainer._submit_batch_to_rollout(batch(4))
    trainer._submit_batch_to_rollout(batch(1))  # a refill of one failed group: 8 x 1 / 4 = 2 roots
    assert [int(sum(b["__rollout_n__"])) for b in submitted] == [8, 2]

    def grow(step, fail):  # what the workers' _run_prompt does for each submitted prompt
        async def every_tree():
            coordinator = RemoteCoordinator(step["__trace_step__"])
            trees = [await coordinator.tree_of(p) for p in step["__trace_prompt__"]]
            return await asyncio.gather(*(grow_tree(broken if t in fail else one_turn(t % 2), coordinator, t, int(n))
                                          for t, n in zip(trees, step["__rollout_n__"])), return_exceptions=True)

        return asyncio.run(every_tree())

    trees = len(submitted[0]["__trace_prompt__"])
    results = grow(submitted[0], fail={0})
    assert isinstance(results[0], RuntimeError) and all(isinstance(r, list) for r in results[1:])
    grow(submitted[1], fail=set())
    trainer._stop_if_too_many_failed()  # 1 of the step's trees: its group is dropped, the step goes on
    metrics = {}
    trainer._fit_predictor(metrics)
    assert metrics["trace/failed_trees"] == 1 and metrics["trace/trees"] == trees + 1
    assert metrics["trace/predictor_examples"] >= 0 and "trace/mixed_group_share" in metrics
    assert "trace/root_v_mean" in metrics and metrics["trace/wait_trees_s"] >= 0

    trainer.global_steps = 2
    submitted.clear()
    trainer._submit_batch_to_rollout(batch(4))
    grow(submitted[0], fail=set(range(len(submitted[0]["__trace_prompt__"]))))
    with pytest.raises(RuntimeError, match=r"^TRACE step 2: \d of \d trees failed, more than "
                                           r"trace.max_failed_share=0.5; the first: .*the sandbox died"):
        trainer._step_once({}, {}, 4)


class SeesThePredictor:
    """verl's checkpoint callback hook (``trainer.checkpoint_callback_class``): records, at each save, whether
    the step's predictor was already in the folder verl hands its remote copy."""

    seen: list = []

    def __init__(self, config):
        pass

    def on_save(self, trainer, global_step, checkpoint_dir, async_save):
        tracker = os.path.join(os.path.dirname(checkpoint_dir), "latest_checkpointed_iteration.txt")
        SeesThePredictor.seen.append((global_step, os.path.exists(os.path.join(checkpoint_dir, "trace_predictor.pkl")),
                                      open(tracker).read()))


class ActorFolder:
    """The actor worker group's part of a checkpoint (FSDP shards on the GPU node): its folder."""

    def save_checkpoint(self, local_path, remote_path, global_steps, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)


class NoData:
    """The dataloader's state (built by ``PPOTrainer.init()`` on the GPU node): none."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        assert state == {}


def test_the_predictor_rides_verls_checkpoint_and_follows_its_resume_rules(verl, tmp_path):
    from trace_train.integrations.verl.trainer import TracePPOTrainer, save_predictor
    from trace_train.predictors import PredictorConfig, build_predictor
    from trace_train.rollout.batch import History

    here = f"{__name__}.SeesThePredictor"
    config = recipe(verl, f"trainer.default_local_dir={tmp_path}", f"++trainer.checkpoint_callback_class={here}",
                    "trainer.max_actor_ckpt_to_keep=2", "trace.predictor=running_mean")
    trainer = TracePPOTrainer(config)
    trainer.actor_rollout_wg, trainer.train_dataloader = ActorFolder(), NoData()
    SeesThePredictor.seen = []
    for step in (1, 2, 3):
        trainer.global_steps = step
        trainer._save_checkpoint()
    # written before verl marks the checkpoint complete and calls its callback; pruned with the actor's
    assert SeesThePredictor.seen == [(1, True, "1"), (2, True, "2"), (3, True, "3")]
    kept = sorted(p for p in os.listdir(tmp_path) if os.path.exists(tmp_path / p / "trace_predictor.pkl"))
    assert kept == ["global_step_2", "global_step_3"]

    # resume_mode=disable: verl starts fresh, and so does the predictor, whatever is on disk
    learnt = build_predictor(PredictorConfig(kind="running_mean"))
    h = [History(0, {"family": "f"}, 1, (), ())]
    learnt.update(h * 4, np.ones(4), np.ones(4))
    save_predictor(learnt, str(tmp_path), 3)
    fresh = TracePPOTrainer(OmegaConf_merge(config, {"trainer": {"resume_mode": "disable"}}))
    before = fresh.predictor(h)
    fresh._load_checkpoint()
    assert fresh.global_steps == 0 and np.array_equal(fresh.predictor(h), before)
    assert not np.array_equal(learnt(h), before)  # what a wrong load would have given


def OmegaConf_merge(config, change):
    from omegaconf import OmegaConf

    return OmegaConf.merge(config, change)
