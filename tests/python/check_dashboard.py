"""Checks Grafana dashboards against Grafana's dashboard schema, as grafana-foundation-sdk
models it (its types are generated from Grafana's own schemas; the PyPI wheel carries the
types, not the JSON Schema files). Each dashboard must decode into the SDK's types with every
value of its declared type (enums by value), encode back without losing or changing a key,
and use only panel and datasource types the SDK knows.

    python check_dashboard.py DASHBOARD.json...   # prints every problem; exit 1 if any
"""

import enum
import json
import sys
import types
import typing

from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog import runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

plugins.register_default_plugins()


def type_errors(value, hint, path, out):
    """Appends where `value` does not have the type `hint` (recursively through SDK models)."""
    origin = typing.get_origin(hint)
    if hint is typing.Any or hint is object:
        return
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return
        present = [o for o in options if o is not type(None)]
        # One type (Optional), or the SDK model the value decoded into: report its own errors.
        decoded = [o for o in present if isinstance(o, type) and hasattr(o, "from_json")
                   and isinstance(value, o)]
        if len(present) == 1 or decoded:
            type_errors(value, (decoded or present)[0], path, out)
            return
        for option in present:
            trial = []
            type_errors(value, option, path, trial)
            if not trial:
                return
        out.append(f"{path}: {value!r} is none of {hint}")
        return
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            out.append(f"{path}: {value!r} is not one of {typing.get_args(hint)}")
        return
    if origin in (list, dict):
        if not isinstance(value, origin):
            out.append(f"{path}: {value!r} is not a {origin.__name__}")
            return
        args = typing.get_args(hint)
        items = enumerate(value) if origin is list else value.items()
        for key, item in items:
            type_errors(item, args[-1], f"{path}[{key!r}]", out)
        return
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        raw = value.value if isinstance(value, enum.Enum) else value
        if raw not in {member.value for member in hint}:
            out.append(f"{path}: {value!r} is not one of {[m.value for m in hint]}")
        return
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return
    if hint is int and isinstance(value, bool):
        out.append(f"{path}: {value!r} is a bool, not an int")
        return
    if isinstance(hint, type) and not isinstance(value, hint):
        out.append(f"{path}: {value!r} is not a {hint.__name__}")
        return
    if hasattr(value, "__dict__") and not isinstance(value, runtime.UnknownDataquery):
        hints = typing.get_type_hints(type(value))
        for name, attribute in vars(value).items():
            if name in hints:
                type_errors(attribute, hints[name], f"{path}.{name}", out)


def lost(original, encoded, path, out):
    """Appends every key or value of `original` that the encoded form does not keep."""
    if isinstance(original, dict):
        if not isinstance(encoded, dict):
            out.append(f"{path}: became {encoded!r}")
            return
        for key, value in original.items():
            if key not in encoded:
                out.append(f"{path}.{key}: not in Grafana's schema here (dropped on decoding)")
            else:
                lost(value, encoded[key], f"{path}.{key}", out)
    elif isinstance(original, list):
        if not isinstance(encoded, list) or len(encoded) != len(original):
            out.append(f"{path}: list became {encoded!r}")
            return
        for i, (a, b) in enumerate(zip(original, encoded)):
            lost(a, b, f"{path}[{i}]", out)
    elif original != encoded:
        out.append(f"{path}: {original!r} became {encoded!r}")


def check(path):
    with open(path) as f:
        data = json.load(f)
    problems = []
    decoded = model.Dashboard.from_json(data)
    type_errors(decoded, model.Dashboard, "dashboard", problems)
    encoded = json.loads(json.dumps(decoded, cls=JSONEncoder))
    lost(data, encoded, "dashboard", problems)
    known_queries = runtime.Runtime().dataquery_variants
    for panel in data.get("panels", []):
        where = f"panel {panel.get('title')!r}"
        if panel["type"] != "row" and runtime.panelcfg_config(panel["type"]) is None:
            problems.append(f"{where}: unknown panel type {panel['type']!r}")
        for target in panel.get("targets", []):
            kind = target.get("datasource", {}).get("type", "")
            if kind not in known_queries:
                problems.append(f"{where}: unknown datasource type {kind!r}")
    return [f"{path}: {p}" for p in problems]


if __name__ == "__main__":
    problems = [p for path in sys.argv[1:] for p in check(path)]
    for problem in problems:
        print(problem)
    sys.exit(1 if problems else 0)
