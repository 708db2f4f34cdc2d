"""Config files and overrides: YAML presets into validated, frozen, nested dataclasses.

``trace-train --config cpu_demo rollout.policy=grpo optim.lr=3e-5`` resolves in three steps:

1. the preset (a name in ``trace_train/presets/`` or a path to a YAML file) gives a nested mapping;
2. each ``dotted.key=value`` override replaces one leaf (the value is read as YAML, so ``3e-5``,
   ``true``, ``null`` and ``[1, 2]`` mean what they look like);
3. the mapping is turned into the config dataclass, field by field, checking names and types; every
   dataclass then validates itself in ``__post_init__``.

Any mistake (an unknown key, with the closest known one suggested; a value of the wrong type; an
impossible combination) is a ``ValueError`` naming the key, raised before anything expensive happens.

Config text is bounded before it is built (:func:`safe_load`): YAML aliases may be used, but the document
they expand to may hold at most :data:`MAX_YAML_NODES` values and nest at most :data:`MAX_YAML_DEPTH`
levels (a "billion laughs" file of a few lines would otherwise expand to 10^9 values when it is walked),
and a recursive alias is refused. Numbers must be usable: an integer field takes a 64-bit integer, a
float field a finite number (``.nan`` and ``.inf`` pass every ``x > 0`` check in the wrong direction or
none at all).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import hashlib
import json
import math
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

__all__ = ["PRESET_DIR", "MAX_YAML_NODES", "MAX_YAML_DEPTH", "safe_load", "available_presets", "load_config", "config_from_dict", "config_to_dict", "fingerprint",
           "drop_removed", "describe", "field_docs"]

PRESET_DIR = Path(__file__).parent / "presets"
MAX_YAML_NODES = 100_000
"""The most values (scalars, lists, mappings) a config document may expand to, aliases expanded."""
MAX_YAML_DEPTH = 64
"""The deepest nesting a config document may have (the presets nest 3 levels)."""
_INT64 = 2**63


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing documents that expand too far (see the module docstring)."""

    def construct_document(self, node):
        _check_expansion(node)
        return super().construct_document(node)


def _check_expansion(root) -> None:
    """Expanded size and depth of a composed YAML graph, in linear time (shared nodes counted once per
    use, computed once); a ValueError past the limits or on a recursive alias."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) once expanded
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, closing = stack.pop()
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
        if closing:
            open_nodes.discard(id(node))
            size = 1 + sum(sizes[id(c)][0] for c in children)
            depth = 1 + max((sizes[id(c)][1] for c in children), default=0)
            if size > MAX_YAML_NODES:
                raise ValueError(f"the document expands to more than {MAX_YAML_NODES} values "
                                 "(aliases expanded)")
            if depth > MAX_YAML_DEPTH:
                raise ValueError(f"the document nests deeper than {MAX_YAML_DEPTH} levels")
            sizes[id(node)] = (size, depth)
        elif id(node) not in sizes:
            if id(node) in open_nodes:
                raise ValueError("a recursive alias (a value that contains itself)")
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children)


def safe_load(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, bounded (see the module docstring); any problem is one ValueError that
    starts with ``where`` (a file name, or the override being read)."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"{where}, line {mark.line + 1}" if mark is not None else where
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{at}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ValueError(f"{where}: not valid YAML: nested deeper than {MAX_YAML_DEPTH} levels") from None
    except ValueError as err:  # the bounds above, or int() refusing a number with too many digits
        raise ValueError(f"{where}: not valid YAML: {str(err).splitlines()[0]}") from None


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_preset(preset: str | Path) -> dict:
    path = Path(preset)
    if path.suffix not in (".yaml", ".yml"):
        path = PRESET_DIR / f"{preset}.yaml"
    if not path.exists():
        raise ValueError(f"no preset {str(preset)!r}; presets: {', '.join(available_presets())} (or a path to a .yaml file)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read the config file: {err}") from None
    data = safe_load(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a preset must be a mapping at the top level")
    return data


def _apply_override(data: dict, override: str) -> None:
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {override!r} must look like dotted.key=value")
    value = safe_load(raw, f"override {override[:80]!r}") if raw.strip() else ""
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {override!r}: {part!r} is a value, not a section")
    node[parts[-1]] = value


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, where: str) -> Any:
    """``value`` as type ``tp`` (dataclasses, Optional/unions, tuples, lists, dicts, Literal, scalars)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ValueError(f"`{where}` must be a section (a mapping), got {value!r}")
        return config_from_dict(tp, value, prefix=where)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if len(errors) == 1 else f"`{where}` has a value of the wrong type: {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ValueError(f"`{where}` must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"`{where}` must be a list, got {value!r}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"`{where}` must be a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"`{where}` must be true or false, got {value!r}")
        return value
    if tp in (int, float) and isinstance(value, str):
        # YAML 1.1 (PyYAML) reads 3e-5 as a string; a number-looking string is a number here.
        try:
            value = float(value) if tp is float else int(value)
        except ValueError:
            pass
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"`{where}` must be an integer, got {value!r}")
        if not -_INT64 <= value < _INT64:
            raise ValueError(f"`{where}` must be a 64-bit integer (|value| < 2**63), got one with "
                             f"{len(str(abs(value)))} digits")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"`{where}` must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the largest float
            number = math.inf
        if not math.isfinite(number):
            raise ValueError(f"`{where}` must be a finite number, got {_short(value)}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"`{where}` must be a string, got {value!r}")
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ValueError(f"`{where}` must be a {_type_name(tp)}, got {value!r}")


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 80 else text[:80] + "..."


def _closest_key(cls, key: str, prefix: str) -> str | None:
    """The full dotted name closest to an unknown ``key`` of section ``prefix``: a field of the section
    (``optim.lrr`` -> ``optim.lr``), else a field of a section nested in it (``lr`` -> ``optim.lr``)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    dotted = (lambda name: f"{prefix}.{name}" if prefix else name)
    close = difflib.get_close_matches(key, names, n=1)
    if close:
        return dotted(close[0])
    nested = {}
    for name, tp in typing.get_type_hints(cls).items():
        if name in names and dataclasses.is_dataclass(tp):
            for sub in dataclasses.fields(tp):
                if sub.init:
                    nested.setdefault(sub.name, dotted(f"{name}.{sub.name}"))
    close = difflib.get_close_matches(key, list(nested), n=1)
    return nested[close[0]] if close else None


def config_from_dict(cls, data: Mapping[str, Any], *, prefix: str = ""):
    """Build dataclass ``cls`` from a nested mapping; unknown keys and wrong types are errors."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        key = unknown[0]
        where = f"{prefix}.{key}" if prefix else str(key)
        close = _closest_key(cls, str(key), prefix)
        hint = f"; did you mean {close!r}?" if close else f"; known keys here: {', '.join(names)}"
        raise ValueError(f"unknown config key {where!r}{hint}")
    kwargs = {}
    for name in names:
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], f"{prefix}.{name}" if prefix else name)
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise ValueError(f"{prefix}: {err}" if prefix else str(err)) from None
    except TypeError as err:  # a required field without a value
        raise ValueError(f"{prefix or cls.__name__}: {err}") from None


def config_to_dict(config) -> dict:
    """Plain nested data (tuples become lists), ready for YAML or JSON."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def fingerprint(config) -> str:
    """A short hash of the resolved config, stored in checkpoints to catch resuming with another one."""
    return hashlib.sha256(json.dumps(config_to_dict(config), sort_keys=True).encode()).hexdigest()[:16]


def load_config(cls, preset: str | Path | None = None, overrides: Sequence[str] = ()):
    """The config of type ``cls`` from a preset (name or YAML path) and ``dotted.key=value`` overrides."""
    data = _read_preset(preset) if preset is not None else {}
    for override in overrides:
        _apply_override(data, override)
    _check_renamed(data, getattr(cls, "RENAMED", {}))
    drop_removed(data, getattr(cls, "REMOVED", ()))
    return config_from_dict(cls, data)


def drop_removed(data: dict, removed: Sequence[str]) -> dict:
    """Drop, in place, the keys of fields that were removed (``cls.REMOVED``: dotted names), so that configs
    saved before their removal still load; returns ``data``."""
    for dotted in removed:
        *sections, key = dotted.split(".")
        node = data
        for part in sections:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(key, None)
    return data


def _check_renamed(data: Mapping, renamed: Mapping[str, str], prefix: str = "") -> None:
    """Refuse keys that were renamed (``cls.RENAMED``: old dotted name -> new), naming the new key."""
    for key, value in data.items():
        where = f"{prefix}{key}"
        if where in renamed:
            raise ValueError(f"config key {where!r} is now {renamed[where]!r}")
        if isinstance(value, Mapping):
            _check_renamed(value, renamed, f"{where}.")


# ---------------------------------------------------------------------------------------------------
# Help generated from the dataclasses: every field with its type, default and docstring
# ---------------------------------------------------------------------------------------------------


def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (and its bases), first sentence-line joined."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def describe(cls, prefix: str = "") -> str:
    """Every field of config ``cls``, grouped by section: ``key  type = default``, then its meaning."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    own, sections = [], []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp, default = hints[f.name], _default(f)
        if dataclasses.is_dataclass(tp):
            sections.append(describe(tp, f"{prefix}{f.name}."))
            continue
        shown = "(required)" if default is dataclasses.MISSING else f"= {json.dumps(_plain(default))}"
        own.append(f"  {prefix}{f.name}: {_type_name(tp)} {shown}\n      {docs.get(f.name, '')}".rstrip())
    title = (prefix.rstrip(".") or "run") + (f": {cls.__doc__.strip().splitlines()[0]}" if cls.__doc__ else "")
    head = [f"[{title}]", *own] if own else []
    return "\n".join(part for part in ["\n".join(head), *sections] if part)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value,
                                 default=str))
