"""Every benchmark that writes evidence records which code it measured, the command and the load
(``benchmarks/README.md``): ``trace_train.bench.origin`` and ``write_results``, which the scripts share."""

import json
import subprocess
import sys
from pathlib import Path

from trace_train.bench import origin, write_results


def _head():
    done = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def test_the_record_names_the_commit_the_command_the_load_and_the_machine():
    record = origin("trace_train.bench.fit", ["--compare", "--arms", "trace grpo"])
    assert record["commit"] == _head() and isinstance(record["dirty"], (bool, type(None)))
    assert record["command"] == "python -m trace_train.bench.fit --compare --arms 'trace grpo'"
    assert len(record["load_average"]) == 3 and record["machine"]["cpus"] >= 1
    assert "torch" not in sys.modules or record["machine"]["torch"] == sys.modules["torch"].__version__


def test_written_results_start_with_the_record_and_keep_every_number(tmp_path):
    out = tmp_path / "deep" / "barrier.json"
    write_results({"backends": {"hf": {"ratio": 1.02}}, "load_average_before": [1.0, 1.0, 1.0]}, str(out),
                  module="trace_train.bench.barrier", argv=["--repeats", "4"])
    data = json.loads(out.read_text())
    assert list(data)[:3] == ["commit", "dirty", "command"] and data["commit"] == _head()
    assert data["command"] == "python -m trace_train.bench.barrier --repeats 4"
    assert data["backends"] == {"hf": {"ratio": 1.02}} and data["load_average_before"] == [1.0, 1.0, 1.0]
