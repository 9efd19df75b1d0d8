"""A tiny declarative schema: one definition gives both validation and OpenAPI.

Every node validates a value at a field path, collecting *all* errors (so
``netsense validate`` can list them), fills defaults, and renders itself as the
OpenAPI v3 structural schema the CRD carries. The CRD can therefore never drift
from what the CLI and the operator accept.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from netsense import units

MISSING: Any = object()


@dataclass(frozen=True)
class Issue:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class Errors(list):
    def add(self, path: str, message: str) -> None:
        self.append(Issue(path, message))


def did_you_mean(word: object, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for a near miss among ``known``, else ''."""
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _join(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)


class Node:
    doc: str = ""

    def parse(self, value: Any, path: str, errors: Errors) -> Any:  # pragma: no cover
        raise NotImplementedError

    def openapi(self) -> dict:  # pragma: no cover
        raise NotImplementedError

    def _described(self, schema: dict) -> dict:
        if self.doc:
            schema["description"] = self.doc
        return schema


@dataclass
class Int(Node):
    min: int | None = None
    max: int | None = None
    doc: str = ""

    def parse(self, value, path, errors):
        if isinstance(value, bool) or not isinstance(value, int):
            errors.add(path, f"must be an integer (got {value!r})")
            return None
        if self.min is not None and value < self.min:
            errors.add(path, f"must be >= {self.min} (got {value})")
        if self.max is not None and value > self.max:
            errors.add(path, f"must be <= {self.max} (got {value})")
        return value

    def openapi(self):
        s: dict = {"type": "integer"}
        if self.min is not None:
            s["minimum"] = self.min
        if self.max is not None:
            s["maximum"] = self.max
        return self._described(s)


@dataclass
class Float(Node):
    min: float | None = None
    max: float | None = None
    exclusive_min: bool = False
    doc: str = ""

    def parse(self, value, path, errors):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.add(path, f"must be a number (got {value!r})")
            return None
        value = float(value)
        if self.min is not None:
            if self.exclusive_min and value <= self.min:
                errors.add(path, f"must be > {self.min:g} (got {value:g})")
            elif not self.exclusive_min and value < self.min:
                errors.add(path, f"must be >= {self.min:g} (got {value:g})")
        if self.max is not None and value > self.max:
            errors.add(path, f"must be <= {self.max:g} (got {value:g})")
        return value

    def openapi(self):
        s: dict = {"type": "number"}
        if self.min is not None:
            s["minimum"] = self.min
            if self.exclusive_min:
                s["exclusiveMinimum"] = True
        if self.max is not None:
            s["maximum"] = self.max
        return self._described(s)


@dataclass
class Bool(Node):
    doc: str = ""

    def parse(self, value, path, errors):
        if not isinstance(value, bool):
            errors.add(path, f"must be true or false (got {value!r})")
        return value

    def openapi(self):
        return self._described({"type": "boolean"})


@dataclass
class Str(Node):
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    max_length: int | None = None
    pattern_hint: str = ""
    doc: str = ""

    def parse(self, value, path, errors):
        if not isinstance(value, str):
            errors.add(path, f"must be a string (got {value!r})")
            return None
        if self.enum is not None and value not in self.enum:
            errors.add(path, f"unknown value {value!r}{did_you_mean(value, self.enum)} (one of: {', '.join(self.enum)})")
        if self.pattern is not None and not re.match(self.pattern, value):
            errors.add(path, f"{value!r} is not valid{': ' + self.pattern_hint if self.pattern_hint else ''}")
        if self.max_length is not None and len(value) > self.max_length:
            errors.add(path, f"at most {self.max_length} characters (got {len(value)})")
        return value

    def openapi(self):
        s: dict = {"type": "string"}
        if self.enum is not None:
            s["enum"] = list(self.enum)
        if self.pattern is not None:
            s["pattern"] = self.pattern
        if self.max_length is not None:
            s["maxLength"] = self.max_length
        return self._described(s)


@dataclass
class Unit(Node):
    """A rate, duration or percentage, kept as written (parsed by users of it), always with its unit: a bare
    number is ambiguous where tc users read milliseconds and percent (``delay: 10``, ``loss: 1``), so it is
    refused with the unit to write; ``bare_seconds`` allows one where the field's name says seconds
    (``maxSeconds: 30``)."""

    kind: str = "rate"  # rate | duration | percent
    doc: str = ""
    bare_seconds: bool = False

    _PARSERS = {
        "rate": (units.parse_rate, units.RATE_PATTERN),
        "duration": (units.parse_duration, units.DURATION_UNIT_PATTERN),
        "percent": (units.parse_fraction_or_percent, units.PERCENT_PATTERN),
    }
    # What the CRD says when a value does not match (the API server would otherwise print the raw pattern).
    _WRITE = {
        "rate": "a rate is written like '200Mbit', '1Gbit' or '500kbit' (bits per second)",
        "duration": "a duration needs its unit: '10ms', '30s', '2m' or '1h' (a bare number is ambiguous)",
        "percent": "a percentage is written like '1%' or '0.1%' (a bare number is ambiguous)",
    }

    def parse(self, value, path, errors):
        parser, _ = self._PARSERS[self.kind]
        bare = not isinstance(value, bool) and (
            isinstance(value, (int, float)) or (self.kind == "duration" and isinstance(value, str)
                                                 and units.is_bare_number(value)))
        if bare and not (self.kind == "duration" and self.bare_seconds):
            errors.add(path, units.bare_number_message(self.kind, value))
            return value
        try:
            parser(value)
        except units.UnitError as e:
            errors.add(path, str(e))
        return value

    def openapi(self):
        _, pattern = self._PARSERS[self.kind]
        rule = {"rule": f"self.matches(r'{pattern}')", "message": self._WRITE[self.kind]}
        if self.kind == "rate":
            return self._described({"type": "string", "maxLength": 32, "x-kubernetes-validations": [
                {"rule": "!self.trim().startsWith('-')", "message": "a rate must be positive"}, rule]})
        if self.bare_seconds:  # a number is seconds here, or a string with its unit
            rule = {**rule, "rule": f"type(self) == int || self.matches(r'{pattern}')"}
        else:  # int-or-string, so that a bare number gets the message, not "must be of type string"
            rule = {**rule, "rule": f"type(self) == string && self.matches(r'{pattern}')"}
        return self._described({"x-kubernetes-int-or-string": True, "maxLength": 32, "x-kubernetes-validations": [rule]})


@dataclass
class Free(Node):
    """An opaque mapping passed through (e.g. Kubernetes resource requirements)."""

    doc: str = ""

    def parse(self, value, path, errors):
        if not isinstance(value, dict):
            errors.add(path, f"must be a mapping (got {value!r})")
        return value

    def openapi(self):
        return self._described({"type": "object", "x-kubernetes-preserve-unknown-fields": True})


@dataclass
class ListOf(Node):
    item: Node = field(default_factory=Free)
    min_items: int = 0
    max_items: int | None = None  # also bounds what a CEL rule over the items may cost the API server
    doc: str = ""

    def parse(self, value, path, errors):
        if not isinstance(value, list):
            errors.add(path, f"must be a list (got {value!r})")
            return None
        if len(value) < self.min_items:
            errors.add(path, f"needs at least {self.min_items} item(s)")
        if self.max_items is not None and len(value) > self.max_items:
            errors.add(path, f"at most {self.max_items} item(s) (got {len(value)})")
        return [self.item.parse(v, _join(path, i), errors) for i, v in enumerate(value)]

    def openapi(self):
        s = {"type": "array", "items": self.item.openapi()}
        if self.min_items:
            s["minItems"] = self.min_items
        if self.max_items is not None:
            s["maxItems"] = self.max_items
        return self._described(s)


@dataclass
class MapOf(Node):
    """A mapping from string keys to values of one kind (labels, a nodeSelector, resource quantities)."""

    value: Node = field(default_factory=lambda: Str())
    max_properties: int | None = None
    doc: str = ""

    def parse(self, value, path, errors):
        if not isinstance(value, dict):
            errors.add(path, f"must be a mapping (got {value!r})")
            return None
        if self.max_properties is not None and len(value) > self.max_properties:
            errors.add(path, f"at most {self.max_properties} entries (got {len(value)})")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                errors.add(path, f"keys must be strings (got {k!r})")
                continue
            out[k] = self.value.parse(v, _join(path, k), errors)
        return out

    def openapi(self):
        s: dict = {"type": "object", "additionalProperties": self.value.openapi()}
        if self.max_properties is not None:
            s["maxProperties"] = self.max_properties
        return self._described(s)


@dataclass
class Quantity(Node):
    """A Kubernetes resource quantity: ``2``, ``500m``, ``16Gi`` (the API server checks the spelling)."""

    doc: str = ""

    def parse(self, value, path, errors):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            errors.add(path, f"must be a quantity such as 2, 500m or 16Gi (got {value!r})")
        return value

    def openapi(self):
        return self._described({"x-kubernetes-int-or-string": True})


@dataclass
class Refused(Node):
    """A field that exists elsewhere (in a PodSpec, say) and is refused here, with the reason. The CRD declares
    it (any value) and refuses it with a CEL rule on its parent, so `kubectl apply` says why, not just
    "unknown field"."""

    reason: str = ""
    type: str = "object"  # what the field is where it belongs: object, array, strings, boolean, string

    def parse(self, value, path, errors):
        errors.add(path, self.reason)
        return None

    def openapi(self):
        anything = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        # CEL sees typed fields only: an array of objects or of strings ("strings"), or a scalar type.
        if self.type == "array":
            return {"type": "array", "items": anything}
        if self.type == "strings":
            return {"type": "array", "items": {"type": "string"}}
        return anything if self.type == "object" else {"type": self.type}


@dataclass
class F:
    """A field of an object: its node, default (MISSING = optional, no default), required."""

    node: Node
    default: Any = MISSING
    required: bool = False


Check = Callable[[dict, str, Errors], None]


@dataclass
class Obj(Node):
    fields: dict[str, F] = field(default_factory=dict)
    checks: Iterable[Check] = ()
    cel: list[dict] = field(default_factory=list)  # x-kubernetes-validations mirroring checks
    doc: str = ""
    # Fields this object had once -> (the value at which they did nothing: accepted and dropped, why else refused)
    removed: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def parse(self, value, path, errors):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            errors.add(path or "(top)", f"must be a mapping (got {type(value).__name__})")
            return {}
        out: dict = {}
        before = len(errors)
        known = ", ".join(n for n, f in self.fields.items() if not isinstance(f.node, Refused))
        for key in value:
            if isinstance(key, bool):  # YAML 1.1 reads unquoted on/off/yes/no keys as booleans
                errors.add(path, f"a key read as the boolean {key} (YAML takes unquoted on/off/yes/no for "
                                 f"booleans); known fields: {known}")
            elif key in self.removed:
                if value[key] != self.removed[key][0]:
                    errors.add(_join(path, key), self.removed[key][1])
            elif key not in self.fields:
                hint = did_you_mean(key, (n for n, f in self.fields.items() if not isinstance(f.node, Refused)))
                errors.add(_join(path, key), f"unknown field{hint}" if hint else f"unknown field (known: {known})")
        for name, f in self.fields.items():
            sub = _join(path, name)
            if name in value and value[name] is not None:
                out[name] = f.node.parse(value[name], sub, errors)
            elif f.required:
                errors.add(sub, "required field is missing")
            elif f.default is dict and isinstance(f.node, (Obj, Union)):
                out[name] = f.node.parse({}, sub, errors)  # a sub-object's own defaults
            elif f.default is not MISSING:
                out[name] = f.default() if callable(f.default) else f.default
        if len(errors) == before:  # cross-field checks only make sense on well-typed fields
            for check in self.checks:
                check(out, path, errors)
        return out

    def openapi(self):
        props = {}
        for name, f in self.fields.items():
            s = f.node.openapi()
            if f.default is dict:
                s["default"] = {}  # so the API server also fills the sub-object's own defaults
            elif f.default is not MISSING and not callable(f.default):
                s["default"] = f.default
            props[name] = s
        s: dict = {"type": "object", "properties": props}
        req = [n for n, f in self.fields.items() if f.required]
        if req:
            s["required"] = req
        refused = [{"rule": f"!has(self.{name})", "message": f.node.reason, "fieldPath": f".{name}"}
                   for name, f in self.fields.items() if isinstance(f.node, Refused)]
        if self.cel or refused:
            s["x-kubernetes-validations"] = [*self.cel, *refused]
        return self._described(s)


@dataclass
class Union(Node):
    """Objects told apart by a discriminator field (e.g. a profile's ``type``)."""

    key: str = "type"
    variants: dict[str, Obj] = field(default_factory=dict)
    doc: str = ""
    what: str = "profile"  # what the variants are, for CEL messages
    default: str | None = None  # the variant when the discriminator is not given
    aliases: dict[str, str] = field(default_factory=dict)  # old variant name -> new: still read, with a warning

    def parse(self, value, path, errors):
        if value is None and self.default is not None:
            value = {}
        if not isinstance(value, dict):
            errors.add(path, f"must be a mapping with a {self.key!r} (got {value!r})")
            return None
        kind = value.get(self.key, self.default)
        if kind in self.aliases:
            warnings.warn(f"{_join(path, self.key)}: {kind!r} is now {self.aliases[kind]!r} (the old name still "
                          "works, for now)", FutureWarning, stacklevel=2)
            kind = self.aliases[kind]
        if kind not in self.variants:
            hint = did_you_mean(kind, [*self.variants, *self.aliases]) if kind is not None else ""
            errors.add(_join(path, self.key), f"unknown or missing {self.key} {kind!r}{hint} "
                                              f"(one of: {', '.join(self.variants)})")
            return None
        variant = self.variants[kind]
        rest = {k: v for k, v in value.items() if k != self.key}
        for k in [k for k in rest if k not in variant.fields]:
            owners = [n for n, v in self.variants.items() if k in v.fields]
            if owners:  # a field of another variant: say so, rather than "unknown"
                errors.add(_join(path, k), f"applies to {self.key} {', '.join(owners)}, not {kind} "
                                           f"(its fields: {', '.join(variant.fields) or 'none'})")
                del rest[k]
        parsed = variant.parse(rest, path, errors)
        return {self.key: kind, **parsed}

    def openapi(self):
        props: dict = {self.key: {"type": "string", "enum": list(self.variants) + list(self.aliases)}}
        if self.default is not None:
            props[self.key]["default"] = self.default
        names = {kind: [kind, *(a for a, k in self.aliases.items() if k == kind)] for kind in self.variants}
        owners: dict[str, list[str]] = {}
        cel = []
        for kind, variant in self.variants.items():
            when = f"self.{self.key} in {names[kind]}"
            # No defaults here: the API server would fill every variant's into every object.
            for name, f in variant.fields.items():
                props.setdefault(name, f.node.openapi())
                owners.setdefault(name, []).append(kind)
                if f.required:
                    cel.append({"rule": f"!({when}) || has(self.{name})", "message": f"a {kind} {self.what} needs {name}"})
            cel += [{**c, "rule": f"!({when}) || ({c['rule']})"} for c in variant.cel]
        for name, kinds in owners.items():  # a field of one variant given with another: refused, as parse does
            props[name]["description"] = (props[name].get("description", "") + f" ({self.key}: {', '.join(kinds)})").strip()
            if len(kinds) < len(self.variants):
                allowed = [n for k in kinds for n in names[k]]
                cel.append({"rule": f"self.{self.key} in {allowed} || !has(self.{name})",
                            "message": f"{name} applies to {self.key} {', '.join(kinds)}"})
        s: dict = {"type": "object", "properties": props}
        if self.default is None:
            s["required"] = [self.key]
        if cel:
            s["x-kubernetes-validations"] = cel
        return self._described(s)
