"""The tool layer stays light: importing it pulls neither torch nor BFCL's folder-creating modules."""

import json
import subprocess
import sys

MODULES = ["trace_train.tools.sandbox", "trace_train.tools.search", "trace_train.tools.retrieval_server",
           "trace_train.tools.tool_calls", "trace_train.tools.bfcl", "trace_train.tools.budget",
           "trace_train.tools.bounded_json", "trace_train.tools.http_client",
           "trace_train.verifiers.answers", "trace_train.verifiers.math", "trace_train.verifiers.qa",
           "trace_train.data.loading", "trace_train.data.math", "trace_train.data.qa"]


def test_tool_layer_imports_without_torch_or_bfcl_utils():
    script = ("import importlib, json, sys\n"
              f"for name in {MODULES!r}:\n    importlib.import_module(name)\n"
              "print(json.dumps(sorted(sys.modules)))")
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                           check=True).stdout))
    assert set(MODULES) <= loaded
    assert not {"torch", "transformers", "vllm"} & loaded
    assert "bfcl_eval.utils" not in loaded and "bfcl_eval.constants.eval_config" not in loaded
