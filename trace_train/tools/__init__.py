"""Tool back ends for the agentic environments: each one is independent of the environment protocol.

- ``sandbox``: sandboxed Python execution (one-shot and persistent sessions) for the math environment.
- ``search``: BM25 search over a local corpus and a Search-R1 HTTP retriever client (multi-hop QA).
- ``http_client``: the retriever client's HTTP/1.1 POST, with one deadline per request and capped reads.
- ``retrieval_server``: a stdlib HTTP server that speaks the Search-R1 retrieval protocol over BM25.
- ``tool_calls``: parsing Qwen3-style ``<tool_call>`` blocks into calls and BFCL call strings.
- ``bfcl``: BFCL v4 multi-turn tasks, the official executable back ends, the official checker, and the
  gate (``admit_call``) that lets only API methods with literal arguments reach the checker's ``eval``.
- ``bounded_json``: JSON from a model or a network peer, with every failure one ``ValueError``.
- ``budget``: a per-episode tool-call budget.

Every back end turns tool failures and timeouts into observation strings and has a cheap, exact
snapshot/restore (or no state at all), so that a continuation from a prefix sees the factual tool state.
"""
