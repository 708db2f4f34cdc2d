"""A second signal stops a run at once, even with a stuck environment call and a stuck thread (issue 34)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.train.test_run_safety import REPO, _args

STUCK_ENV = '''
import threading
from pathlib import Path


class Stuck:
    """Rows of any shape; ``step`` leaves a thread that is not a daemon behind and never returns
    (not concurrency-safe: one worker, the documented plugin path)."""

    def __init__(self, marker=""):
        self.marker = marker

    def reset(self, row):
        return [{"role": "user", "content": "Say a number."}]

    def step(self, action):
        threading.Thread(target=threading.Event().wait, name="leftover", daemon=False).start()
        Path(self.marker).write_text("stuck")
        threading.Event().wait()

    def verify(self):
        return 0.0

    def snapshot(self):
        return None

    def restore(self, snapshot):
        pass
'''


def _first_signal_taken(proc) -> str:
    """stderr up to the handler's "stopping after this step" line: the first signal was handled, so the
    second is a second (sent a fixed pause later instead, under load the two could arrive together and be
    taken as one, and the process would wait for a second that never comes)."""
    seen = ""
    for line in proc.stderr:
        seen += line
        if "stopping after this step" in line:
            return seen
    return seen  # the process ended first: the caller's asserts say how


def test_a_second_signal_ends_a_run_held_by_a_stuck_call_within_a_minute(tmp_path):
    env_file, marker = tmp_path / "stuck_env.py", tmp_path / "stuck.txt"
    env_file.write_text(STUCK_ENV)
    (tmp_path / "rows.jsonl").write_text("".join('{"w": %d}\n' % i for i in range(16)))
    args = _args(tmp_path / "run", f"task.name={env_file}:Stuck", f"task.train={tmp_path / 'rows.jsonl'}",
                 "task.rows={}", "task.eval_size=4", f"task.env={{marker: {marker}}}", "steps=3",
                 "rollout.env_timeout_s=3600", "--quiet")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trace_train.train", *args], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert marker.exists(), proc.stderr.read()[-2000:] if proc.poll() is not None else "no step in 300 s"
        proc.send_signal(signal.SIGTERM)
        taken = _first_signal_taken(proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        err = taken + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("trace-train: stopped by SIGTERM; nothing saved since the start"), last


WATCHED = textwrap.dedent('''
    import os, signal, sys, time
    from trace_train.run.signals import RunInterrupted, StopOnSignal
    stop = StopOnSignal(lambda: 7, grace_s=1.0)
    ready = False
    while True:  # a main thread that never ends, whatever the handler raises (held in cleanup, say)
        try:  # "ready" inside the try: a signal taken as the print returns is caught too
            if not ready:
                ready = True
                print("ready", flush=True)
            time.sleep(1000)
        except RunInterrupted:
            pass
''')


def test_the_watchdog_ends_a_process_whose_main_thread_does_not_end_after_a_second_signal(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", WATCHED], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        taken = _first_signal_taken(proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        err = taken + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "stopping after this step" in err
    assert "stopped at once by a second signal" in err and "nothing saved since step 7" in err


def _install(saved_step):
    """A StopOnSignal and the watchdog thread it started."""
    import threading

    from trace_train.run.signals import StopOnSignal

    running = set(threading.enumerate())
    stop = StopOnSignal(saved_step)
    (watchdog,) = [t for t in threading.enumerate() if t not in running]
    return stop, watchdog


def test_the_watchdog_holds_no_reference_to_its_run():
    """A watchdog that outlives its run must not free the run: a daemon thread that drops the last
    reference to a tensor while the interpreter exits aborts the process (the trainer's exit 134 after
    "stopped by SIGTERM", one run in six)."""
    import gc
    import weakref

    from trace_train.run.signals import _SIGNALS

    before = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    run = type("Run", (), {})()
    stop, watchdog = _install(lambda: run)
    try:
        for sig, handler in before.items():  # what still holds the StopOnSignal is the watchdog, if anything
            signal.signal(sig, handler)
        owner, run_ref = weakref.ref(stop), weakref.ref(run)
        del stop, run
        gc.collect()
        assert owner() is None and run_ref() is None
        assert watchdog.is_alive()  # still reading the pipe
    finally:
        os.close(signal.set_wakeup_fd(-1))  # the watchdog's write end: it reads the end and returns
        watchdog.join(10)
    assert not watchdog.is_alive()


def test_restore_ends_the_watchdog_before_it_returns():
    for _ in range(20):
        stop, watchdog = _install(lambda: None)
        assert watchdog.is_alive()
        stop.restore()
        assert not watchdog.is_alive()
