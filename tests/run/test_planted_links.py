"""Links planted in a run directory or an output folder change no file outside it (issue 34): uid 1000
plants, root runs; planted links and files in the caller's own folder are one line each."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from trace_train.evaluate import EvalConfig
from trace_train.evaluate import main as evaluate
from trace_train.run.files import UnsafePathError, open_no_follow, subdir, write_file, writable_dir
from trace_train.train import cli

from tests.train.test_trainer import SMALL

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="uid 1000 plants, root runs: needs a root test process")


@pytest.fixture
def shared():
    """A folder under /tmp that uid 1000 can reach: ``base`` (root's, 0755) holding the victims (root's,
    0600) and ``base/outside`` (a folder root writes nothing to)."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="trace-planted-"))
    os.chmod(base, 0o755)
    victims = {}
    for name in ("secret", "shadow", "keys"):
        path = base / name
        path.write_text(f"root's {name}\n")
        os.chmod(path, 0o600)
        victims[path] = path.read_bytes()
    (base / "outside").mkdir()
    yield base, victims
    shutil.rmtree(base, ignore_errors=True)


def _as_uid_1000(fn) -> None:
    """Run ``fn()`` in a child process as uid/gid 1000 (the planting user)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(1000)
            os.setuid(1000)
            fn()
            os._exit(0)
        except BaseException:  # noqa: BLE001 - report through the exit status
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the planting child failed"


def _unchanged(victims, outside: Path) -> None:
    for path, content in victims.items():
        assert path.read_bytes() == content, f"{path} was written through a planted link"
    assert list(outside.iterdir()) == [], f"root wrote into {outside}"


@needs_root
def test_root_refuses_a_run_dir_that_uid_1000_planted_links_in(shared, capsys):
    base, victims = shared
    run_dir = base / "run"
    run_dir.mkdir()
    os.chown(run_dir, 1000, 1000)
    secret, shadow, keys = victims

    def plant():
        os.symlink(secret, run_dir / "run.lock")
        os.symlink(shadow, run_dir / "config.yaml")
        os.symlink(keys, run_dir / "metrics.jsonl")
        os.symlink(base / "outside", run_dir / "checkpoints")
        os.symlink(secret, run_dir / f".write-test-{os.getppid()}")  # the old probe name: the runner's pid

    _as_uid_1000(plant)
    code = cli(["--config", "cpu_demo", f"run_dir={run_dir}", *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("trace-train: `run_dir`") and "owned by uid 1000" in err[-1]
    _unchanged(victims, base / "outside")
    # trace-eval's output folder: the same refusal, before any model is loaded
    out = base / "eval"
    out.mkdir()
    os.chown(out, 1000, 1000)
    _as_uid_1000(lambda: os.symlink(secret, out / "summary.json"))
    data = base / "rows.jsonl"
    data.write_text('{"id": "a", "problem": "What is 1 + 1?", "answer": "2"}\n')
    with pytest.raises(UnsafePathError, match="owned by uid 1000"):
        evaluate(EvalConfig(model="unused", benchmark="math", data=str(data), output_dir=str(out)))
    _unchanged(victims, base / "outside")


@needs_root
def test_root_refuses_a_link_of_uid_1000_on_the_way_and_a_world_writable_parent(shared):
    base, _ = shared
    mine = base / "mine"
    mine.mkdir()
    link = base / "via"
    os.symlink(mine, link)
    os.lchown(link, 1000, 1000)
    with pytest.raises(UnsafePathError, match="is a link owned by uid 1000"):
        writable_dir(link / "run", "`run_dir`")
    open_dir = base / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UnsafePathError, match="writable by everyone"):
        writable_dir(open_dir / "run", "`run_dir`")
    os.chmod(open_dir, 0o1777)  # sticky, as /tmp
    assert writable_dir(open_dir / "run", "`run_dir`").is_dir()


def test_planted_links_and_files_in_ones_own_run_dir_are_one_line_each(tmp_path, capsys):
    """Whoever runs: run.lock as a link, a checkpoint path as a link to a folder, env_errors and hf as
    files are refused in one line naming them, and nothing outside changes."""
    victim, outside = tmp_path / "victim.txt", tmp_path / "outside"
    victim.write_text("keep me")
    outside.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(victim, run_dir / "run.lock")
    args = ["--config", "cpu_demo", f"run_dir={run_dir}", *SMALL, "steps=2", "checkpoint_every=2", "--quiet"]
    assert cli(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"trace-train: {run_dir / 'run.lock'} is a symbolic link; refusing to write through it (remove it)"
    (run_dir / "run.lock").unlink()
    (run_dir / "checkpoints").mkdir()
    os.symlink(outside, run_dir / "checkpoints" / "step_00000002")
    assert cli(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"trace-train: {run_dir / 'checkpoints' / 'step_00000002'} is a symbolic link")
    assert not any("Traceback" in line or "rmtree" in line for line in err)
    assert victim.read_text() == "keep me" and list(outside.iterdir()) == []


def test_the_file_helpers_never_follow_links(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "summary.json"
    os.symlink(victim, link)
    write_file(link, "{}\n")  # replaces the link itself
    assert victim.read_text() == "keep" and not link.is_symlink() and link.read_text() == "{}\n"
    os.symlink(victim, tmp_path / "results.jsonl")
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        open_no_follow(tmp_path / "results.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_no_follow(tmp_path / "fifo", os.O_RDWR | os.O_CREAT)
    (tmp_path / "hf").write_text("not a folder")
    with pytest.raises(UnsafePathError, match="hf is a file, not a folder"):
        subdir(tmp_path, "hf")
    os.symlink(tmp_path, tmp_path / "env_errors")
    with pytest.raises(UnsafePathError, match="env_errors is a symbolic link"):
        subdir(tmp_path, "env_errors")
    assert victim.read_text() == "keep"
    assert not list(tmp_path.glob(".write-test-*"))
    writable_dir(tmp_path / "new", "`run_dir`")
    assert not list((tmp_path / "new").iterdir())  # the probe (random name, O_EXCL) is gone
