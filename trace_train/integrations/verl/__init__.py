"""TRACE as a plugin of verl 0.9.x (its V1 trainer, tested on 0.9.1): no fork, verl's registries plus the
private methods listed below.

==========================  ============================================================================
verl hook                   what TRACE puts there (module)
==========================  ============================================================================
``verl.plugins``            entry point ``trace`` -> :mod:`.plugin`: checks the verl version, registers
                            everything below, says in one warning line what is wrong when it cannot
``register_adv_est``        ``trace`` (and ``trace_grpo``): ``trace_theory.advantages`` on the step's
                            trees, rebuilt from each trajectory's extra fields (:mod:`.estimator`)
agent loop registry         ``trace_tool_agent``: verl's ``ToolAgentLoop`` that records every turn
                            boundary's exact token state and can resume from one (:mod:`.agent_loop`)
``_run_prompt``             :class:`~.worker.TraceAgentLoopWorker`: bare sessions first, then
                            continuation sessions from prefixes, decided by ``trace_theory.step``'s
                            streamed expansion (:mod:`.tree_growth`, :mod:`.coordinator`)
``register_trainer``        ``trace``: the sync V1 trainer plus the batch hook that sets each prompt's
                            ``__rollout_n__`` from the root allocation, the tree-aware advantage call,
                            and the predictor's fit and checkpoint (:mod:`.trainer`)
==========================  ============================================================================

**Private parts of verl it relies on** (named by a leading underscore; a verl release may change them
without notice, which is why :data:`VERL_VERSIONS` stops below the next minor release):

* overridden: ``PPOTrainer._build_replay_buffer``, ``._submit_batch_to_rollout``, ``._step_once``,
  ``._compute_advantage``, ``._save_checkpoint``, ``._load_checkpoint`` (:mod:`.trainer`);
  ``AgentLoopWorkerTQ._run_prompt`` (:mod:`.worker`); ``ToolAgentLoop._handle_pending_state``,
  ``._handle_generating_state``, ``._handle_processing_tools_state`` (:mod:`.agent_loop`);
* called or read: ``AgentLoopWorker._agent_loop_postprocess``, ``._compute_score`` and
  ``_agent_loop_registry`` (:mod:`.worker`), ``PPOTrainer._get_required_batch_multiple`` (the recipe's
  test).

Public: ``register_adv_est``, ``register_trainer``, the agent loop ``register`` decorator, the
``verl.plugins`` entry point, ``BaseTool`` and the checkpoint callback.

Only :mod:`.plugin`, :mod:`.estimator`, :mod:`.agent_loop`, :mod:`.worker` and :mod:`.trainer` import
verl; :mod:`.trees`, :mod:`.coordinator` and :mod:`.tree_growth` are plain Python and NumPy (tested in
any venv). ``recipe_math_qwen3_8b.yaml`` next to this file is the math preset as a verl config.
"""

VERL_VERSION = "0.9.1"
"""The verl release the plugin's tests run against (``pip install -e '.[verl]'`` in the TRACE repository)."""

VERL_VERSIONS = ">=0.9.1,<0.10"
"""The verl releases the plugin registers with (``pyproject.toml``'s ``verl`` extra says the same): 0.9.1 is
the newest release on the package index and the one tested; older releases lack the V1 trainer hooks the
plugin overrides (see docs/verl.md), a 0.10 may change the private methods listed above."""

TRAJECTORY_FIELDS = ("trace_tree", "trace_parent", "trace_depth", "trace_nodes", "trace_turn_starts")
"""Extra fields every TRACE trajectory carries (``AgentLoopOutput.extra_fields``): its tree (the prompt's
uid), the node its session started from (0: the root), its leaf's depth, the tree-local ids of the turns
it generated and the response-token offset where each of those turns begins."""
