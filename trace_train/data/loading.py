"""One entry point for rows of a data set: a Hugging Face data set id or a local file.

``source`` is treated as a local file when it names an existing file, ends in a file suffix
(``.jsonl``, ``.json``, ``.parquet``, ``.csv``, ...) or cannot be a Hub id (it starts with ``/``, ``.``
or ``~``, or has more than one ``/``); a local folder (a data set repository, e.g. a downloaded Hub data
set with its split files) is read by ``datasets.load_dataset(folder, subset, split=split)``; a local
file is read with ``datasets``' packaged
``json``/``parquet`` builders (so the rows look exactly as they would from the Hub). A local path that
does not exist is an error here; it is never sent to the Hub. Anything else (``name`` or
``owner/name``) is a Hub id, loaded with ``datasets.load_dataset(source, subset, split=split)``.
Loading from the Hub needs network access on the user's machine; local files do not.

A local file that is empty, or a JSON Lines file with a line that is not a JSON object, is refused with
an error that names the file and the line. A local file loads without ``datasets``' "Generating train
split" progress bar.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_FILE_SUFFIX = re.compile(r"\.(jsonl|json|parquet|csv|tsv|txt|arrow|gz|zip)$", re.IGNORECASE)


def is_local_source(source: str | os.PathLike) -> bool:
    """Whether ``source`` names a local file (existing or not) rather than a Hugging Face Hub id."""
    text = os.fspath(source)
    return Path(text).exists() or bool(_FILE_SUFFIX.search(text)) or not _HUB_ID.match(text)


def _check_json_lines(path: Path) -> int:
    """The rows of JSON Lines file ``path``; a ValueError naming its first line that is not a JSON object."""
    rows = 0
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:  # its own "line 1 column 5" counts within the line
                    raise ValueError(f"{path}, line {number}: not valid JSON ({err.msg} at column {err.colno})") from None
                except RecursionError:
                    raise ValueError(f"{path}, line {number}: not valid JSON (nested too deeply)") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}, line {number}: a row must be a JSON object, "
                                     f"got {type(row).__name__}")
                rows += 1
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: not UTF-8 text ({err})") from None
    return rows


@contextmanager
def _no_progress_bars(datasets):
    """``datasets``' progress bars off for the block, then back as they were."""
    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


def load_rows(
    source: str | os.PathLike,
    *,
    split: str = "train",
    subset: str | None = None,
    limit: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """Rows of a data set as plain dicts, in file order; at most ``limit`` of them.

    ``split`` and ``subset`` (a Hub configuration name) apply to Hub ids only: a local file is one split.
    """
    import datasets  # heavy; only loaded when data is

    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"`limit` must be a non-negative integer or None, got {limit!r}")
    path = Path(source).expanduser()
    if is_local_source(source) and not path.is_dir():  # a folder is a data set repository: datasets reads it
        if not path.is_file():
            raise FileNotFoundError(f"data file {str(path)!r} does not exist (a local path is never looked "
                                    "up on the Hugging Face Hub)")
        builder = _BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"local data files must end in .jsonl, .json or .parquet, got {str(path)!r}")
        if path.stat().st_size == 0:
            raise ValueError(f"data file {str(path)!r} is empty")
        if path.suffix.lower() == ".jsonl" and _check_json_lines(path) == 0:
            raise ValueError(f"data file {str(path)!r} holds no rows")
        try:
            with _no_progress_bars(datasets):  # a local file loads in a blink: no "Generating train split" bar
                dataset = datasets.load_dataset(
                    builder,
                    data_files=str(path.resolve()),
                    split="train",
                    cache_dir=None if cache_dir is None else str(cache_dir),
                )
        except Exception as err:  # datasets wraps parse errors in its own types; name the file
            raise ValueError(f"data file {str(path)!r} cannot be read: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}") from None
        if len(dataset) == 0:
            raise ValueError(f"data file {str(path)!r} holds no rows")
    else:
        from ..preflight import require_hub

        if not Path(str(source)).is_dir():  # a local Hub-style folder (one file per split) loads as it is
            require_hub(str(source), "dataset", "data")  # the cache or a reachable Hub, else one line
        dataset = datasets.load_dataset(
            str(source), subset, split=split, cache_dir=None if cache_dir is None else str(cache_dir)
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return dataset.to_list()


def pick_field(row: dict[str, Any], candidates: tuple[str, ...], explicit: str | None, what: str) -> str:
    """The column holding ``what``: ``explicit`` if given, else the first candidate present in ``row``."""
    if explicit is not None:
        if explicit not in row:
            raise ValueError(f"{what} field {explicit!r} is not a column; columns are {sorted(row)}")
        return explicit
    for name in candidates:
        if name in row:
            return name
    raise ValueError(
        f"no {what} field found among {list(candidates)}; columns are {sorted(row)}; "
        f"pass the column name explicitly"
    )
