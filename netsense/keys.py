"""One naming style per place: result.json's keys are snake_case (a file's contract), a NetSenseJob's status is
camelCase like the rest of Kubernetes; ``.status.result`` is result.json with its keys in camelCase."""

from __future__ import annotations


def camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def camel_keys(value):
    """Every dict key in camelCase, at every depth; values as they are."""
    if isinstance(value, dict):
        return {camel(k): camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


def snake_keys(value):
    """camel_keys undone (for result.json's own keys, which have no capitals)."""
    if isinstance(value, dict):
        return {snake(k): snake_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake_keys(v) for v in value]
    return value
