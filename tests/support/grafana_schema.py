"""A Grafana dashboard JSON checked against Grafana's dashboard schema, as Grafana's own generated
models (grafana-foundation-sdk, the `test` extra, built for Grafana 11.6) describe it.

The models decode a dashboard (panels' options and field config through each panel plugin's model,
queries through each data source's) but keep only the fields the schema knows and do not check
types. So a dashboard is valid here when decoding and encoding it gives the same JSON back, bar
defaults the encoder adds (no field lost: none unknown or misspelt), and every decoded value has
the type, enum member or literal its field is declared with.
"""

from __future__ import annotations

import enum
import json
import types
import typing

try:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard
except ImportError as e:  # a clear failure, not a skip: the test extra names the package
    raise ImportError(
        "grafana-foundation-sdk is missing: pip install -e '.[test]' (it needs Python 3.11+)"
    ) from e

# The panel plugins' models (options, field config) and the data sources' (queries): without them
# those parts decode as untyped bags that keep anything.
register_default_plugins()

# Fields Grafana's frontend writes that the schema leaves open (not modelled): a query variable's
# `definition`, the query text the variable editor shows.
UNMODELLED = {("templating", "list", "*", "definition")}


def _lost_fields(src, out, path: tuple) -> list[str]:
    """Paths present in src and missing or different in out."""
    if isinstance(src, dict) and isinstance(out, dict):
        problems = []
        for k, v in src.items():
            where = (*path, k)
            if tuple("*" if isinstance(p, int) else p for p in where) in UNMODELLED:
                continue
            if k not in out:
                problems.append(f"{'.'.join(map(str, where))}: not a field of Grafana's dashboard schema")
            else:
                problems += _lost_fields(v, out[k], where)
        return problems
    if isinstance(src, list) and isinstance(out, list) and len(src) == len(out):
        return [p for i, (a, b) in enumerate(zip(src, out)) for p in _lost_fields(a, b, (*path, i))]
    return [] if src == out else [f"{'.'.join(map(str, path))}: {src!r} decodes as {out!r}"]


_MODELS = "grafana_foundation_sdk.models."


def _type_problems(value, hint, where: str) -> list[str]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (typing.Any, object):  # e.g. a panel's options: the plugin's model, when it has one
        return _model_problems(value, where) if type(value).__module__.startswith(_MODELS) else []
    if origin in (typing.Union, types.UnionType):
        branches = [_type_problems(value, a, where) for a in args]
        if any(not b for b in branches):
            return []
        # Report the branch of the value's own shape (a list, a model), else the whole union.
        shaped = [b for a, b in zip(args, branches) if isinstance(value, typing.get_origin(a) or a)]
        return shaped[0] if shaped else [f"{where}: {value!r} is none of {hint}"]
    if origin is typing.Literal:
        return [] if value in args else [f"{where}: {value!r} is not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {value!r}"]
        return [p for i, v in enumerate(value) for p in _type_problems(v, args[0] if args else object, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {value!r}"]
        return [p for k, v in value.items() for p in _type_problems(v, args[1] if args else object, f"{where}.{k}")]
    if value is None and hint is type(None):
        return []
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return [] if value in {m.value for m in hint} else [f"{where}: {value!r} is not one of {[m.value for m in hint]}"]
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{where}: expected a number, got {value!r}"]
    if hint in (int, str, bool):
        ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
        return [] if ok else [f"{where}: expected {hint.__name__}, got {value!r}"]
    if isinstance(hint, type):  # a nested model (or a variant's base class: a query, a panel's options)
        if not isinstance(value, hint):
            return [f"{where}: expected {hint.__name__}, got {value!r}"]
        return _model_problems(value, where) if type(value).__module__.startswith(_MODELS) else []
    return [f"{where}: unhandled type {hint}"]


def _model_problems(obj, where: str) -> list[str]:
    hints = typing.get_type_hints(type(obj))
    return [p for name, hint in hints.items() for p in _type_problems(getattr(obj, name, None), hint, f"{where}.{name}")]


def dashboard_problems(dashboard: dict) -> list[str]:
    decoded = Dashboard.from_json(dashboard)
    encoded = json.loads(json.dumps(decoded, cls=JSONEncoder))
    return [*_lost_fields(dashboard, encoded, ()), *_model_problems(decoded, "dashboard")]
