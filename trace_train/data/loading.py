"""One entry point for rows of a data set: a Hugging Face data set id or a local file.

``source`` is treated as a local file when it names an existing file or ends in ``.jsonl``, ``.json``
or ``.parquet``; those are read with ``datasets``' packaged ``json``/``parquet`` builders (so the
rows look exactly as they would from the Hub). Anything else is a Hub id, loaded with
``datasets.load_dataset(source, subset, split=split)``. Loading from the Hub needs network access on
the user's machine; local files do not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


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
    path = Path(source)
    if path.suffix in _BUILDERS or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"data file {str(path)!r} does not exist")
        builder = _BUILDERS.get(path.suffix)
        if builder is None:
            raise ValueError(f"local data files must end in .jsonl, .json or .parquet, got {str(path)!r}")
        dataset = datasets.load_dataset(
            builder,
            data_files=str(path.resolve()),
            split="train",
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
    else:
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
