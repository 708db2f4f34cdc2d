"""The sharded reference frees its root after each forward (FSDP2 keeps a root module gathered for the
backward, which a frozen reference never runs), and the memory plan's row is what it held."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_sharded_reference_holds_no_gathered_root_after_its_forward(tmp_path):
    """On 2 gloo ranks, right after each forward of the reference FSDP2 holds its root gathered: exactly the
    plan's P_root x 4 bytes (fp32 compute here; the embedding, tied, and the final norm). After the trainer's
    ``policy_update`` nothing of the reference is gathered (before the fix the root stayed: the same bytes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={_free_port()}",
           str(Path(__file__).with_name("reference_root.py")), str(tmp_path / "log")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in (0, 1):
        log = json.loads((tmp_path / "log" / f"rank{rank}.json").read_text())
        assert log["after_forward"] and all(b == log["root_bytes"] for b in log["after_forward"])
        assert log["after_update"] == 0
