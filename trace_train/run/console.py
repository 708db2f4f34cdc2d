"""What ``trace-train`` prints: the per-step line, the step-0 evaluation, warnings, and the libraries' chatter.

- The per-step line (every ``log_every`` steps, none with ``--quiet``)::

      step 3/20  reward 0.413  eval 0.520  loss 0.046  kl 0.0012  gnorm 0.41  lr 1e-03  eff 0.63  mixed/1k 312.5  tokens 1234  4.1 s

  ``reward`` is ``reward_mean``, ``eval`` held-out success (on evaluation steps), ``loss``, ``kl`` and
  ``gnorm`` the update's loss, KL to the reference and gradient norm before clipping, ``lr`` the
  optimiser's learning rate, ``all-fail`` the share of groups with no success, ``eff`` the effective ratio,
  ``mixed/1k`` mixed prompts per 1,000 rollouts,
  ``tokens`` generated tokens, then the step's seconds. The step-0 evaluation's line says when every one of
  its rollouts failed (``eval 0.000`` alone reads like a rounding). Pipelined expansion's first step trains nothing
  (``step 1/20  pipeline fill: ...; no update  2.0 s``).
- A progress bar with the time left (``ETA``) only when stderr is a terminal (one that reports no size,
  as a bare pseudo-terminal does, gets 100 columns); otherwise each step line ends with the time left,
  ``ETA 0:01:23`` (:class:`Eta`: the mean seconds per step of this process so far times the steps left).
- Standard output is line-buffered (:func:`line_buffered`), so under ``nohup``, ``| tee`` or ``> log`` each
  step line appears when printed, and in a ``2>&1`` log the closing lines (standard error) follow the step
  lines they came after.
- Every message (warnings, the signal's "stopping after this step") goes through :func:`say`, which
  prints it on its own line above the bar, never inside it.
- transformers' and vLLM's logging is set to warnings (``TRANSFORMERS_VERBOSITY``, ``VLLM_LOGGING_LEVEL``)
  unless ``--verbose`` is given or the user set those variables.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Mapping

__all__ = ["finished_line", "resume_env", "RESUME_ENV", "metrics_line", "eval_line", "progress", "say", "quiet_libraries", "is_terminal", "line_buffered", "Eta",
           "shows_bar"]


def is_terminal(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _f(m: Mapping, key: str) -> float:
    value = m.get(key, float("nan"))
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def metrics_line(step: int, steps: int, m: Mapping, lr: float | None = None, eta: str | None = None) -> str:
    """One step's console line (the module docstring names each field), ending in ``ETA eta`` where given."""
    if m.get("pipeline_fill"):  # rollout.expansion=pipelined, first step: no tree is whole yet
        return (f"step {step}/{steps}  pipeline fill: this step's trees complete in the next step's wave; no "
                f"update  {m.get('rollout_seconds', 0.0):.1f} s")
    parts = [f"step {step}/{steps}", f"reward {_f(m, 'reward_mean'):.3f}"]
    if "eval_success" in m:
        parts.append(f"eval {_f(m, 'eval_success'):.3f}")
    parts += [f"loss {_f(m, 'loss'):.4f}", f"kl {_f(m, 'kl'):.4f}", f"gnorm {_f(m, 'grad_norm'):.3f}"]
    if lr is not None:
        parts.append(f"lr {lr:.0e}")
    if "all_fail_group_share" in m:  # groups with no success: nothing to learn from (run/all_fail.py)
        parts.append(f"all-fail {_f(m, 'all_fail_group_share'):.2f}")
    parts += [f"eff {_f(m, 'effective_ratio'):.2f}",
              f"mixed/1k {_f(m, 'mixed_prompts_per_1k_rollouts'):.1f}",
              f"tokens {int(m.get('generated_tokens', 0))}",
              f"{m.get('rollout_seconds', 0.0) + m.get('train_seconds', 0.0):.1f} s"]
    if m.get("env_failures"):
        parts.append(f"env failures {int(m['env_failures'])}")
    if eta:
        parts.append(f"ETA {eta}")
    return "  ".join(parts)


def _count(m: Mapping, key: str) -> int:
    value = _f(m, key)
    return int(value) if value == value and abs(value) < 1e15 else 0  # NaN (absent) and inf count as none


def eval_line(step: int, steps: int, m: Mapping) -> str | None:
    """The line of an evaluation outside a training step (step 0, before any update); None without one."""
    if "eval_success" not in m:
        return None
    line = f"step {step}/{steps}  eval {_f(m, 'eval_success'):.3f}  (held-out success before training"
    rollouts, failures = (_count(m, key) for key in ("eval_rollouts", "eval_env_failures"))
    if _f(m, "eval_success") == 0 and rollouts > 0:
        line += f"; every one of its {rollouts} rollouts failed"
        if failures:
            line += f", {failures} of them in an environment failure"
    return line + ")"


BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}, ETA {remaining}, {rate_fmt}]"


def shows_bar(show: bool = True) -> bool:
    """Whether :func:`progress` draws a bar: ``show`` and stderr is a terminal."""
    return show and is_terminal()


def progress(steps: Iterable, *, start: int, total: int, show: bool = True) -> Iterable:
    """``steps`` wrapped in a tqdm bar with the time left when ``show`` and stderr is a terminal, else unchanged.
    A terminal that reports 0 columns or rows (a pseudo-terminal nobody sized) gets 100 x 24: tqdm draws
    nothing at 0 rows."""
    if not shows_bar(show):
        return steps
    from tqdm.auto import tqdm

    try:
        size = os.get_terminal_size(sys.stderr.fileno())
        columns, rows = size.columns, size.lines
    except (OSError, ValueError, AttributeError):
        columns = rows = 0
    return tqdm(steps, initial=start, total=total, desc="train", unit="step", bar_format=BAR_FORMAT,
                ncols=None if columns else 100, nrows=None if rows else 24)


class Eta:
    """The time a run has left: ``(now - started) / (step - first) * (total - step)``, the mean seconds per
    step this process took so far (a resumed run counts from its first step) times the steps left."""

    def __init__(self, first: int, total: int, clock=time.monotonic):
        self.first, self.total, self.clock, self.started = first, total, clock, clock()

    def text(self, step: int) -> str | None:
        """``H:MM:SS`` left after ``step`` steps, or None before a step has finished."""
        if step <= self.first:
            return None
        left = (self.clock() - self.started) / (step - self.first) * max(self.total - step, 0)
        minutes, seconds = divmod(int(round(left)), 60)
        return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def line_buffered(stream=None) -> None:
    """Flush ``stream`` (default stdout) at every line where it is not a terminal (a terminal already is):
    a pipe or a file is otherwise block-buffered, and nothing shows until the run ends."""
    stream = sys.stdout if stream is None else stream
    if not is_terminal(stream) and hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(line_buffering=True)
        except (ValueError, OSError):
            pass


def finished_line(steps: int, run_dir: str, start: str) -> str:
    """The closing line: where the run went, and the model it started from (``run_dir/tiny_model`` for the
    tiny model), which ``trace-eval --model`` scores as the "before" of the trained ``hf/``."""
    start = os.path.join(run_dir, "tiny_model") if start == "tiny" else start
    return (f"run finished: {steps} steps in {run_dir} (metrics.jsonl, checkpoints/, hf/ for trace-eval and "
            f"vLLM); the model it started from, for trace-eval's before-and-after: --model {start}")


RESUME_ENV = ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_CACHE",
              "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
"""The environment variables a printed resume command repeats where the user set them: where the task's
module and the models are found, and which devices the run used."""


def resume_env() -> str:
    """``NAME=value `` for each of :data:`RESUME_ENV` set now (shell-quoted), to put before a resume command."""
    import shlex

    return "".join(f"{name}={shlex.quote(os.environ[name])} " for name in RESUME_ENV if name in os.environ)


def say(text: str, file=None) -> None:
    """Print ``text`` on its own line (above a running progress bar, if any)."""
    from tqdm.auto import tqdm

    tqdm.write(text, file=sys.stderr if file is None else file)


def quiet_libraries(verbose: bool = False) -> None:
    """transformers' and vLLM's log output at warning level (and no transformers progress bars when stderr is
    not a terminal), unless ``verbose`` or the user set the variables; call before either is imported."""
    if verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "info")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if not is_terminal():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
