"""Checks made before anything heavy loads, so that a plausible mistake is one line, not a library's traceback.

- :func:`check_device`: ``cuda`` asked where torch finds no CUDA device (a CPU build, or no GPU).
- :func:`check_model`: a model that is neither ``tiny``, a local Hugging Face model directory, nor a Hub id
  that can be fetched. A name that can only be a path (it starts with ``.``, ``/`` or ``~``, or has more than
  one ``/``) and does not exist is "no such directory", never sent to the Hub (which would answer "Repo id
  must be in the form ...").
- :func:`require_hub`: a Hub id (model or data set) needs either the local Hugging Face cache or a reachable
  Hub. Without network, one connection attempt of at most ``HUB_TIMEOUT_S`` decides: a cached id then loads
  offline (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1`` are set, so the libraries do not retry five times),
  an uncached one is refused in one line saying what to do.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["check_device", "check_model", "require_hub", "looks_like_path", "hub_reachable", "HUB_TIMEOUT_S"]

HUB_TIMEOUT_S = 3.0
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_reachable: dict[tuple[str, int], bool] = {}


def check_device(device: str, what: str = "device") -> None:
    """Refuse ``cuda`` / ``cuda:N`` where torch finds no such CUDA device."""
    if not str(device).startswith("cuda"):
        return
    import torch

    if torch.cuda.is_available():
        index = str(device).partition(":")[2]
        if index and int(index) >= torch.cuda.device_count():
            raise ValueError(f"{what}={device}, but torch finds {torch.cuda.device_count()} CUDA device(s)")
        return
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    raise ValueError(f"{what}={device}, but torch {torch.__version__} ({build}) finds no CUDA device on this "
                     f"machine: use {what}=cpu (or auto, which picks a GPU when there is one)")


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a local path: it starts with ``.``, ``/`` or ``~``, has more than one
    ``/``, or is not a valid Hub id (``name`` or ``owner/name``)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or not _HUB_ID.fullmatch(name)


def check_model(name: str, what: str = "model.name_or_path") -> None:
    """``tiny``, an existing model directory, or a Hub id that the cache or the network can serve."""
    if name == "tiny":
        return
    path = Path(name).expanduser()
    if path.is_dir():  # what it holds is for the loaders to say
        return
    if path.exists():
        raise ValueError(f"{what}={name} is a file; a local model is a directory (with config.json)")
    if looks_like_path(name):
        raise ValueError(f"{what}={name}: no such directory (a local model is a directory holding config.json; "
                         "a Hub id is owner/name)")
    require_hub(name, "model", what)


def require_hub(repo_id: str, repo_type: str, what: str) -> None:
    """Pass when the Hub can serve ``repo_id`` or the local cache holds it (then go offline); else one
    ``ValueError`` saying what to do."""
    cached = _in_cache(repo_id, repo_type)
    if _offline():
        if cached:
            return
        raise ValueError(f"{what}={repo_id} is a Hub id that is not in the local Hugging Face cache, and "
                         "HF_HUB_OFFLINE is set: download it first (or pass a local path)")
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    if hub_reachable(host, endpoint.port or (80 if endpoint.scheme == "http" else 443)):
        return
    if cached:
        _go_offline()
        print(f"note: {host} cannot be reached; {repo_id} is loaded from the local cache (offline)", file=sys.stderr)
        return
    fetch = "hf download" + (" --repo-type dataset" if repo_type == "dataset" else "")
    raise ValueError(f"{what}={repo_id} is a Hub id that is not in the local Hugging Face cache, and {host} "
                     f"cannot be reached (no network?): run `{fetch} {repo_id}` on a machine with network and "
                     "copy the cache, or pass a local path")


def hub_reachable(host: str, port: int = 443, timeout: float = HUB_TIMEOUT_S) -> bool:
    """One TCP connection to ``host`` within ``timeout`` seconds (name lookup included); remembered."""
    if (host, port) in _reachable:
        return _reachable[host, port]
    result = [False]

    def attempt():
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result[0] = True
        except OSError:
            pass

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout + 0.5)  # a name lookup has no timeout of its own
    _reachable[host, port] = result[0]
    return result[0]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _go_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # read at import time: tell an already imported hub client too
        constants.HF_HUB_OFFLINE = True


def _in_cache(repo_id: str, repo_type: str) -> bool:
    """Whether the Hugging Face cache (the hub's, or the datasets library's for a data set) holds ``repo_id``."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    hub = Path(os.environ.get("HF_HUB_CACHE", os.environ.get("HUGGINGFACE_HUB_CACHE", home / "hub"))).expanduser()
    folders = [hub / f"{repo_type}s--{repo_id.replace('/', '--')}"]
    if repo_type == "dataset":
        folders.append(Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets")).expanduser()
                       / repo_id.replace("/", "___"))
    return any(folder.is_dir() for folder in folders)
