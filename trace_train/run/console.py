"""What ``trace-train`` prints: the per-step line, the step-0 evaluation, warnings, and the libraries' chatter.

- The per-step line (every ``log_every`` steps, none with ``--quiet``)::

      step 3/20  reward 0.413  eval 0.520  loss 0.046  kl 0.0012  gnorm 0.41  lr 1e-03  eff 0.63  mixed/1k 312.5  tokens 1234  4.1 s

  ``reward`` is ``reward_mean``, ``eval`` held-out success (on evaluation steps), ``loss``, ``kl`` and
  ``gnorm`` the update's loss, KL to the reference and gradient norm before clipping, ``lr`` the
  optimiser's learning rate, ``eff`` the effective ratio, ``mixed/1k`` mixed prompts per 1,000 rollouts,
  ``tokens`` generated tokens, then the step's seconds. Pipelined expansion's first step trains nothing
  (``step 1/20  pipeline fill: ...; no update  2.0 s``).
- A progress bar only when stderr is a terminal; redirected to a file, the output is plain lines.
- Every message (warnings, the signal's "stopping after this step") goes through :func:`say`, which
  prints it on its own line above the bar, never inside it.
- transformers' and vLLM's logging is set to warnings (``TRANSFORMERS_VERBOSITY``, ``VLLM_LOGGING_LEVEL``)
  unless ``--verbose`` is given or the user set those variables.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, Mapping

__all__ = ["metrics_line", "eval_line", "progress", "say", "quiet_libraries", "is_terminal"]


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


def metrics_line(step: int, steps: int, m: Mapping, lr: float | None = None) -> str:
    """One step's console line (the module docstring names each field)."""
    if m.get("pipeline_fill"):  # rollout.expansion=pipelined, first step: no tree is whole yet
        return (f"step {step}/{steps}  pipeline fill: this step's trees complete in the next step's wave; no "
                f"update  {m.get('rollout_seconds', 0.0):.1f} s")
    parts = [f"step {step}/{steps}", f"reward {_f(m, 'reward_mean'):.3f}"]
    if "eval_success" in m:
        parts.append(f"eval {_f(m, 'eval_success'):.3f}")
    parts += [f"loss {_f(m, 'loss'):.4f}", f"kl {_f(m, 'kl'):.4f}", f"gnorm {_f(m, 'grad_norm'):.3f}"]
    if lr is not None:
        parts.append(f"lr {lr:.0e}")
    parts += [f"eff {_f(m, 'effective_ratio'):.2f}",
              f"mixed/1k {_f(m, 'mixed_prompts_per_1k_rollouts'):.1f}",
              f"tokens {int(m.get('generated_tokens', 0))}",
              f"{m.get('rollout_seconds', 0.0) + m.get('train_seconds', 0.0):.1f} s"]
    if m.get("env_failures"):
        parts.append(f"env failures {int(m['env_failures'])}")
    return "  ".join(parts)


def eval_line(step: int, steps: int, m: Mapping) -> str | None:
    """The line of an evaluation outside a training step (step 0, before any update); None without one."""
    if "eval_success" not in m:
        return None
    return f"step {step}/{steps}  eval {_f(m, 'eval_success'):.3f}  (held-out success before training)"


def progress(steps: Iterable, *, start: int, total: int, show: bool = True) -> Iterable:
    """``steps`` wrapped in a tqdm bar when ``show`` and stderr is a terminal, else unchanged."""
    if not show or not is_terminal():
        return steps
    from tqdm.auto import tqdm

    return tqdm(steps, initial=start, total=total, desc="train", unit="step")


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
