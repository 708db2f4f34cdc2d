"""Real sessions on CPU: verl's tool agent loop (``trace_tool_agent``) generating with a tiny model, grown
into TRACE trees by the plugin's tree growth and step coordinator, as the ``_run_prompt`` override does.

What runs is verl's own code from the prompt to the trajectory: ``ToolAgentLoop``'s state machine, its
Continuous-Token builder (prompt rendering, assistant-token and tool-response merges) and tool dispatch,
with our snapshot/resume added. What stands in for a GPU deployment: the LLM server (a tiny Qwen3 generating
with transformers in this process, behind verl's ``generate(request_id, prompt_ids, sampling_params)``
call) and the reward (the game's verdict, computed here instead of by verl's reward-loop actor). The tool
is a guess-the-number judge; a tool parser reads each assistant message as one guess.
"""

from __future__ import annotations

import asyncio
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from trace_theory import Prediction, RolloutBudget, compute_advantages, get_policy
from tests.integrations.verl.test_allocation_on_cpu import trees
from trace_train.envs import GuessNumberEnv, make_rows
from trace_train.integrations.verl.coordinator import StepCoordinator, ThreadedCoordinator
from trace_train.integrations.verl.tree_growth import grow_tree
from trace_train.integrations.verl.trees import forest_from_trajectories
from trace_train.predictors import PredictorConfig, build_predictor
from trace_train.rollout.batch import History

ROWS = make_rows(3, high=4, max_guesses=3, seed=5)
MAX_TURNS = 3


@pytest.fixture(scope="module")
def stack(verl, tiny_dir):
    """verl's pieces for CPU sessions: config, tokenizer, the tiny model's server, the guess parser and tool."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
    from verl.workers.rollout.replica import TokenOutput

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    class TinyServer:
        """verl's LLM client call, answered by the tiny model. Sampling is seeded by the context and by how many
        times that context was asked before, so a step's outcomes do not depend on the order sessions run in
        (only which of several identical requests gets which draw does)."""

        asked: dict = {}

        async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
            key = tuple(prompt_ids)
            TinyServer.asked[key] = TinyServer.asked.get(key, 0) + 1
            torch.manual_seed(hash(key) % 2**31 + 7919 * TinyServer.asked[key])
            ids = torch.tensor([prompt_ids])
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                     top_k=0, max_new_tokens=6, eos_token_id=end, pad_token_id=end)
            new = out[0, ids.shape[1]:].tolist()
            await asyncio.sleep(0)
            return TokenOutput(token_ids=new, log_probs=[0.0] * len(new))

    @ToolParser.register("trace_guess_cpu")
    class GuessParser(ToolParser):
        """Every assistant message is one call of ``guess`` with its text."""

        async def extract_tool_calls(self, responses_ids, tools=None):
            text = self.tokenizer.decode(responses_ids, skip_special_tokens=True).strip()
            return text, [FunctionCall(name="guess", arguments=json.dumps({"text": text}))]

    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "prompt_length": 512, "response_length": 256, "full_determinism": False,
            "multi_turn": {"max_user_turns": MAX_TURNS, "max_assistant_turns": MAX_TURNS, "max_parallel_calls": 1,
                           "max_tool_response_length": 200, "tool_response_truncate_side": "right",
                           "format": "trace_guess_cpu"}}},
        "data": {"apply_chat_template_kwargs": {}, "mm_processor_kwargs": {}},
    })
    return config, tokenizer, TinyServer()


def guess_tool(target: int):
    """The judge of one game, as a verl function tool."""
    from verl.tools.function_tool import FunctionTool
    from verl.tools.schemas import OpenAIFunctionToolSchema

    def guess(text: str) -> str:
        digits = "".join(ch for ch in text if ch.isdigit())
        if not digits:
            return "That is not a number."
        n = int(digits)
        return "Correct!" if n == target else ("Higher." if n < target else "Lower.")

    schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": "guess", "description": "Judge a guess.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}})
    return FunctionTool(name="guess", fn=guess, tool_schema=schema)


def won(messages) -> float:
    return 1.0 if any(m.get("role") == "tool" and m.get("content") == "Correct!" for m in messages) else 0.0


def run_step(stack, policy_name="trace", budget=RolloutBudget(6, 2), *, executor_threads=None, timeout=600,
             last_tree=None):
    """One step of real sessions over ``ROWS``; ``last_tree``: that pool prompt's sessions start only once every
    other tree has expanded (and waits in ``rest`` for it)."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    from trace_train.integrations.verl.agent_loop import TraceToolAgentLoop, run_trace_session

    config, tokenizer, server = stack
    server.asked.clear()  # every step draws the same outcomes
    predictor = build_predictor(PredictorConfig(kind="running_mean"))
    openings = [History(i, row, 0, tuple(GuessNumberEnv().reset(row)), ()) for i, row in enumerate(ROWS)]

    def predict(histories, concentration):
        return Prediction(predictor(histories), predictor.concentration(histories) if concentration else None)

    coordinator = StepCoordinator(get_policy(policy_name), budget, len(ROWS), predict, openings, seed=0,
                                  timeout=timeout)
    m = coordinator.start()
    starts = {}

    def runner(prompt: int):
        row = ROWS[prompt]
        messages = list(openings[prompt].messages)

        async def run_session(start, session_id):
            while prompt == last_tree and len(coordinator._expanded) < int((m > 0).sum()) - 1:
                await asyncio.sleep(0.01)
            loop = TraceToolAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                                      processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
                                      tools=ToolListWrap([guess_tool(int(row["target"]))]))

            async def score(output):  # the game's verdict, from the session's final messages
                return won(loop_messages[0])

            loop_messages = []
            original = loop._handle_pending_state

            async def pending(agent_data, sampling_params):  # keep a handle on the session's messages
                loop_messages.append(agent_data.messages)
                return await original(agent_data, sampling_params)

            loop._handle_pending_state = pending
            session = await run_trace_session(loop, {"temperature": 1.0, "top_p": 1.0, "logprobs": True},
                                              {"raw_prompt": messages}, start, prompt=prompt, row=row, score=score)
            starts[(prompt, session_id)] = (start, session.output)
            return session

        return run_session

    waited = ThreadedCoordinator(coordinator)

    async def every_tree():
        if executor_threads:  # the pool verl's token merges and tool-parser decodes run on (run_in_executor)
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=executor_threads))
        return await asyncio.gather(*(grow_tree(runner(int(p)), waited, coordinator.tree_of(int(p)), int(m[p]),
                                                tree_id=int(p)) for p in np.flatnonzero(m)))

    leaves = [leaf for tree in asyncio.run(every_tree()) for leaf in tree]
    record, histories = coordinator.record_with_histories()
    return record, leaves, starts, m, histories


def test_sessions_grow_trees_from_exact_prefix_states(stack):
    record, leaves, starts, m, _ = run_step(stack)
    assert m.sum() == record.planned.roots and record.counts["continuation"] > 0
    # One verl trajectory per session; together they spend the step's budget, M (1 + N) rollouts.
    assert len(leaves) == record.rollouts == record.planned.roots * (1 + record.planned.continuations_per_root)
    for (prompt, session_id), (start, output) in starts.items():
        full = list(output.prompt_ids) + list(output.response_ids)
        if start is None:
            continue
        state = start.state
        # A continuation starts from its prefix's exact token state: the same ids, not re-rendered text...
        assert full[:len(state["prompt_ids"])] == list(state["prompt_ids"])
        # ...and trains only what it generated: the prefix's response tokens are masked out.
        prefix_response = len(state["response_mask"])
        assert set(output.response_mask[:prefix_response]) <= {0}
        assert sum(output.response_mask[prefix_response:]) > 0
    # The trajectories' extra fields rebuild the coordinator's forest, node for node.
    rewards = [leaf.output.reward_score for leaf in leaves]
    rebuilt, _ = forest_from_trajectories([leaf.fields for leaf in leaves], rewards)
    f = record.forest
    assert np.array_equal(rebuilt.parent, f.parent) and np.allclose(np.nan_to_num(rebuilt.reward, nan=-1),
                                                                   np.nan_to_num(f.reward, nan=-1))
    assert np.array_equal(rebuilt.depth, f.depth) and np.array_equal(rebuilt.origin, f.origin)
    assert np.isfinite(compute_advantages(rebuilt, "trace")).all()
    for leaf in leaves:
        assert leaf.fields["trace_depth"] == int(f.depth[leaf.fields["trace_nodes"][-1] + _offset(f, leaf)])


def test_trees_waiting_for_each_other_hold_no_thread_verls_agent_loop_needs(stack):
    """More trees than the event loop's default executor has threads (here 1): verl's agent loop merges tokens
    and decodes tool calls on that executor, so trees that waited on it for the step's other trees (one
    thread each) would starve the sessions they wait for until the coordinator's timeout."""
    record, leaves, _, m, _ = run_step(stack, executor_threads=1, timeout=60, last_tree=0)
    assert m[0] > 0 and int((m > 0).sum()) > 1  # more trees than threads
    assert len(leaves) == record.rollouts == record.planned.roots * (1 + record.planned.continuations_per_root)


def _offset(forest, leaf):
    """The forest id of tree ``trace_tree``'s root (trees are laid out in planting order)."""
    return int(forest.roots[list(forest.prompt[forest.roots]).index(leaf.fields["trace_tree"])])


def test_the_predictor_is_fitted_on_the_steps_trees_and_saved_with_verls_checkpoint(stack, tmp_path):
    from omegaconf import OmegaConf

    from trace_train.integrations.verl.coordinator import fit_predictor_on_step
    from trace_train.integrations.verl.trainer import load_predictor, resume_folder, save_predictor

    record, leaves, _, _, histories = run_step(stack)
    assert load_predictor(str(tmp_path / "global_step_3")) is None  # no checkpoint yet
    predictor = build_predictor(PredictorConfig(kind="running_mean"))
    assert len(histories) == len(record.forest) and all(histories[r] is not None for r in record.forest.roots)
    before = predictor.state_dict()
    metrics = fit_predictor_on_step(predictor, record, histories)
    f = record.forest
    assert metrics["predictor_examples"] == int((~f.is_leaf & (f.parent != -1)).sum()) > 0
    assert predictor.state_dict()["means"].shape != before["means"].shape  # it learnt something
    save_predictor(build_predictor(PredictorConfig(kind="running_mean")), str(tmp_path), 2)  # an older one
    save_predictor(predictor, str(tmp_path), 3)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")  # verl's tracker, as its save writes it
    probe = [h for h in histories if h is not None][:4]
    auto = OmegaConf.create({"resume_mode": "auto", "default_local_dir": str(tmp_path), "resume_from_path": None})
    loaded = load_predictor(resume_folder(auto, 3))
    np.testing.assert_array_equal(loaded(probe), predictor(probe))
    # resume_path: the folder named, not the latest; disable (or a fresh start): none at all
    path = OmegaConf.merge(auto, {"resume_mode": "resume_path", "resume_from_path": str(tmp_path / "global_step_2")})
    assert resume_folder(path, 2) == str(tmp_path / "global_step_2")
    assert not np.array_equal(load_predictor(resume_folder(path, 2))(probe), predictor(probe))
    assert resume_folder(OmegaConf.merge(auto, {"resume_mode": "disable"}), 0) is None
    assert resume_folder(auto, 0) is None


GUESS_TOOL_FILE = '''
from verl.tools.function_tool import function_tool


@function_tool
def guess(text: str) -> str:
    """Judge a guess of the number (it is 3).

    Args:
        text: The guess.
    """
    digits = "".join(ch for ch in text if ch.isdigit())
    if not digits:
        return "That is not a number."
    return "Correct!" if int(digits) == 3 else ("Higher." if int(digits) < 3 else "Lower.")
'''


def worker_tools(tmp_path):
    from verl.tools.tool_registry import load_all_tools

    return load_all_tools(tool_config_path=None, function_tool_path=str(tmp_path / "guess_tool.py"))


def test_one_trace_step_through_the_trainer_on_ray(stack, tiny_dir, tmp_path):
    """One TRACE step through ``TracePPOTrainer`` on a local Ray with TransferQueue, up to the calls that need
    the GPU workers (docs/verl.md): the trainer's batch hook (root allocation, coordinator actor), verl's
    AgentLoopWorkerTQ with our ``_run_prompt`` (real verl sessions, the tiny model behind the server call),
    verl's replay buffer sampling the step, the trainer's advantage step, predictor fit and metrics, and its
    checkpoint save and resume. A reward actor stands in for verl's reward loop; the worker's default
    executor has fewer threads than the step has trees."""
    import ray
    import transfer_queue as tq
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from trace_train.integrations.verl.trainer import TracePPOTrainer
    from trace_train.integrations.verl.worker import TraceAgentLoopWorker

    (tmp_path / "guess_tool.py").write_text(GUESS_TOOL_FILE)
    import verl.trainer.config as verl_config

    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={tiny_dir}", "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=256", "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={MAX_TURNS}",
            f"actor_rollout_ref.rollout.multi_turn.max_user_turns={MAX_TURNS}",
            "actor_rollout_ref.rollout.multi_turn.format=trace_guess_cpu",
            f"actor_rollout_ref.rollout.multi_turn.function_tool_path={tmp_path / 'guess_tool.py'}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=trace_tool_agent",
            "actor_rollout_ref.rollout.name=vllm"])
    with initialize_config_dir(config_dir=os.path.abspath(os.path.join(
            os.path.dirname(__file__), "..", "..", "..", "trace_train", "integrations", "verl")), version_base=None):
        # verl's rollout correction reads the actor's recomputed log-probs (a GPU call): bypassed
        recipe = compose(config_name="recipe_math_qwen3_8b", overrides=[
            "algorithm.rollout_correction.bypass_mode=true", "trace.roots=6", "trace.continuations_per_root=2",
            f"data.train_batch_size={len(ROWS)}", "trace.predictor=running_mean",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))

        @ray.remote
        class Verdict:
            """The reward loop's place, a graded verdict on the decoded response: 1 for the judge's "Correct!",
            1/2 for a guess it called too low (``Higher.``), else 0 (graded, so that groups mix)."""

            def __init__(self, path):
                from transformers import AutoTokenizer

                self.tokenizer = AutoTokenizer.from_pretrained(path)

            def compute_score(self, data):
                text = self.tokenizer.decode(data.batch["responses"][-1].tolist())
                score = 1.0 if "Correct!" in text else 0.5 if "Higher." in text else 0.0
                return {"reward_score": score, "reward_extra_info": {}}

        from verl.utils import tensordict_utils as tu

        from trace_train.integrations.verl.agent_loop import opening_tokens

        _, _, server = stack
        server.asked.clear()
        worker = TraceAgentLoopWorker(config, server, reward_loop_worker_handles=[Verdict.remote(tiny_dir)])

        class Manager:
            """verl's AgentLoopManagerTQ dispatch (``generate_sequences`` of each worker), to one in-process worker
            whose event loop's default executor has one thread."""

            def generate_sequences(self, batch):
                async def every_prompt():
                    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
                    await worker.generate_sequences(batch)
                    await asyncio.gather(*list(worker.background_tasks))

                asyncio.run(every_prompt())

        trainer = TracePPOTrainer(recipe)
        trainer.global_steps, trainer.agent_loop_manager = 1, Manager()
        tokens = opening_tokens(stack[1], tools=worker_tools(tmp_path))
        trainer._tokens = tokens  # the agent loop's rendering (the trainer builds it from the recipe's tools)
        raw = np.empty(len(ROWS), dtype=object)
        raw[:] = [GuessNumberEnv().reset(row) for row in ROWS]
        batch = tu.get_tensordict({"raw_prompt": raw, "uid": np.array([f"prompt{i}" for i in range(len(ROWS))],
                                                                       dtype=object),
                                   "index": np.arange(len(ROWS)),
                                   "data_source": np.array(["guess"] * len(ROWS), dtype=object)})
        tu.assign_non_tensor_data(batch, "global_steps", 1)
        trainer._submit_batch_to_rollout(batch)  # the batch hook: root allocation, then verl's dispatch
        (coordinator, openings), = trainer._coordinators
        record = ray.get(coordinator.record.remote())
        assert [h.messages for h in openings] == [tuple(r) for r in raw]
        trainer._stop_if_too_many_failed()
        meta, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=trainer._submitted)
        keys = list(meta.keys)
        assert len(keys) == record.rollouts == 6 * 3  # one trajectory per session, {uid}_{session}_0
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["extra_fields", "rm_scores"])
        fields = data.pop("extra_fields").tolist()  # read back as verl's trainer reads them
        rewards = [float(r.sum()) for r in data.pop("rm_scores").unbind(0)]
        rebuilt, _ = forest_from_trajectories(fields, rewards)
        assert sorted(trees(rebuilt).values()) == sorted(trees(record.forest).values())  # same trees, by prompt uid
        # The roots' predictions read the openings' tokens exactly as the agent loop rendered them.
        prompts = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["prompts", "uid"])
        by_uid = dict(zip(prompts.pop("uid").tolist(), [p.tolist() for p in prompts.pop("prompts").unbind(0)]))
        assert all(by_uid[f"prompt{p}"] == list(openings[p].token_ids) for p in np.flatnonzero(record.groups))
        # The trainer's advantage step (verl's, with the tree fields read from TransferQueue) writes
        # trace_theory's advantage of each turn's node onto that turn's tokens.
        trainer._compute_advantage(meta, metrics={})
        written = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "response_mask"])
        advantages = [a.tolist() for a in written.pop("advantages").unbind(0)]
        masks = [m_.tolist() for m_ in written.pop("response_mask").unbind(0)]
        node_adv = compute_advantages(rebuilt, "trace")
        _, turns = forest_from_trajectories(fields, rewards)
        checked = 0
        for b, f in enumerate(fields):
            bounds = list(f["trace_turn_starts"]) + [len(masks[b])]
            for j, node in enumerate(turns[b]):
                for t in range(bounds[j], bounds[j + 1]):
                    assert advantages[b][t] == pytest.approx(node_adv[node] * masks[b][t], abs=1e-5)
                    checked += 1
        assert checked > 0 and np.abs(node_adv).sum() > 0
        # The predictor's fit on the step's forest, with the allocation's metrics for verl's tracker.
        metrics = {}
        trainer._fit_predictor(metrics)
        assert metrics["trace/predictor_examples"] > 0 and metrics["trace/trees"] == int((record.groups > 0).sum())
        assert metrics["trace/rollouts_continuation"] == record.counts["continuation"] > 0
        assert sum(v for k, v in metrics.items() if k.startswith("trace/continuations_depth_")) > 0
        # Its checkpoint inside verl's save, and verl's resume (the actor's part: its folder only).
        from tests.integrations.verl.test_trainer_on_cpu import ActorFolder, NoData

        trainer.actor_rollout_wg, trainer.train_dataloader = ActorFolder(), NoData()
        trainer._save_checkpoint()
        resumed = TracePPOTrainer(recipe)
        resumed.actor_rollout_wg, resumed.train_dataloader = worker_group_that_loads(), NoData()
        resumed._load_checkpoint()
        assert resumed.global_steps == 1
        assert resumed.predictor.state_dict()["mean_keys"] == trainer.predictor.state_dict()["mean_keys"]
        probe = list(openings)
        np.testing.assert_array_equal(resumed.predictor(probe), trainer.predictor(probe))
    finally:
        tq.close()
        ray.shutdown()


def worker_group_that_loads():
    class Loads:
        def load_checkpoint(self, local_path, del_local_after_load=False):
            assert os.path.isdir(local_path)

    return Loads()
