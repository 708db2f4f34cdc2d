"""The GPU check runs, in its reduced CPU form, and writes the JSON its sections promise."""

import json

from trace_train import gpu_check


def test_gpu_check_cpu_smoke_writes_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--cpu-smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["cpu_smoke"] and result["ok"]
    packing = result["tree_packing"]
    assert {r["width"] for r in packing} == {299, 713} and not any(r["width_multiple_of_128"] for r in packing)
    assert all(r["dense_vs_leaf"]["grad"] <= gpu_check.TOLERANCE["float32"]["grad"] for r in packing)
    [steps] = result["training_steps"]
    assert steps["matrix_entries_moved"] > 0.5 and steps["norm_entries_moved"] > 0.5  # fp32: every weight moves
    full, chunked = result["logprob_memory"]
    assert full["chunk_tokens"] == 0 and chunked["chunk_tokens"] > 0
    assert chunked["peak_mb"] < full["peak_mb"] / 2  # memory, not timing: the chunked head holds far less
    assert {r["packing"] for r in result["update_throughput"]} == {"leaf", "tree"}
