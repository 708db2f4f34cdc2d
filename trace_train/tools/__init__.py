"""Tool back ends for the agentic environments: each one is independent of the environment protocol.

- ``sandbox``: sandboxed Python execution (one-shot and persistent sessions) for the math environment.
- ``search``: BM25 search over a local corpus and a Search-R1 HTTP retriever client (multi-hop QA).
- ``retrieval_server``: a stdlib HTTP server that speaks the Search-R1 retrieval protocol over BM25.
- ``tool_calls``: parsing Qwen3-style ``<tool_call>`` blocks into calls and BFCL call strings.
- ``bfcl``: BFCL v4 multi-turn tasks, the official executable back ends, the official checker.
- ``budget``: a per-episode tool-call budget.

Every back end turns tool failures and timeouts into observation strings and has a cheap, exact
snapshot/restore (or no state at all), so that a continuation from a prefix sees the factual tool state.
"""
