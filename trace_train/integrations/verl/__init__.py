"""TRACE as a plugin of verl 0.9.1 (its V1 trainer): no fork, only verl's public hooks.

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

Only :mod:`.plugin`, :mod:`.estimator`, :mod:`.agent_loop`, :mod:`.worker` and :mod:`.trainer` import
verl; :mod:`.trees`, :mod:`.coordinator` and :mod:`.tree_growth` are plain Python and NumPy (tested in
any venv). ``recipe_math_qwen3_8b.yaml`` next to this file is the math preset as a verl config.
"""

VERL_VERSION = "0.9.1"
"""The verl release this plugin is written and tested against (``pip install -e '.[verl]'`` in the TRACE repository)."""

TRAJECTORY_FIELDS = ("trace_tree", "trace_parent", "trace_depth", "trace_nodes", "trace_turn_starts")
"""Extra fields every TRACE trajectory carries (``AgentLoopOutput.extra_fields``): its tree (the prompt's
uid), the node its session started from (0: the root), its leaf's depth, the tree-local ids of the turns
it generated and the response-token offset where each of those turns begins."""
