"""pydantic's validation errors as one ConfigError naming the key and the reason."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import (
    AliasChoices,
    BaseModel,
    ValidationError,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from aprof._config.steps import key_member, show_value
from aprof._errors import ConfigError


def config_error(exc: ValidationError, root: type[BaseModel]) -> ConfigError:
    """One ConfigError for a ValidationError: its first error, plus how many more there are."""
    errors = exc.errors(include_url=False)
    if not errors:
        return ConfigError(None, str(exc))
    key, reason = _key_and_reason(errors[0], root)
    if len(errors) > 1:
        reason += f" (and {len(errors) - 1} more)"
    return ConfigError(key or None, reason)


def _key_path(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        member = f"[{part}]" if isinstance(part, int) else key_member(part)
        path += member.removeprefix(".") if not path else member
    return path


def _key_and_reason(error: ErrorDetails, root: type[BaseModel]) -> tuple[str, str]:
    loc, kind, ctx = tuple(error["loc"]), error["type"], error.get("ctx") or {}
    got = show_value(error.get("input"))
    key = _key_path(loc)
    if kind == "value_error" and isinstance(ctx.get("error"), ConfigError):
        inner: ConfigError = ctx["error"]
        return key + (inner.key or ""), inner.reason
    if kind == "extra_forbidden":
        return key, _unknown_key(root, loc)
    if kind == "invalid_key":
        return _key_path(loc[:-1]), f"keys must be strings, got {got}"
    simple = {
        "greater_than": lambda: f"must be > {_bound(ctx, 'gt')}, got {got}",
        "greater_than_equal": lambda: f"must be >= {_bound(ctx, 'ge')}, got {got}",
        "less_than": lambda: f"must be < {_bound(ctx, 'lt')}, got {got}",
        "less_than_equal": lambda: f"must be <= {_bound(ctx, 'le')}, got {got}",
        "finite_number": lambda: f"must be a finite number, got {got}",
        "int_type": lambda: f"expected an integer, got {got}",
        "float_type": lambda: f"expected a number, got {got}",
        "bool_type": lambda: f"expected true or false, got {got}",
        "string_type": lambda: f"expected a string, got {got}",
        "list_type": lambda: f"expected a list, got {got}",
        "dict_type": lambda: f"expected a mapping, got {got}",
        "model_type": lambda: f"expected a mapping, got {got}",
        "model_attributes_type": lambda: f"expected a mapping, got {got}",
        "path_type": lambda: f"expected a path, got {got}",
        "literal_error": lambda: (
            f"expected one of {str(ctx.get('expected', '')).replace(' or ', ', ')}, got {got}"
        ),
    }
    if kind in simple:
        return key, simple[kind]()
    if kind == "value_error":
        return key, str(ctx.get("error", error["msg"]))
    msg = error["msg"]
    return key, f"{msg[:1].lower()}{msg[1:]}, got {got}"


def _bound(ctx: dict[str, Any], name: str) -> object:
    # Float fields report `gt=0.0`; "must be > 0" reads better.
    value = ctx.get(name)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _unknown_key(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    name = str(loc[-1]) if loc else ""
    fields = _fields_at(root, loc[:-1])
    if fields is None:
        return "unknown key"
    for field_name, info in fields.items():
        if (
            isinstance(info.validation_alias, AliasChoices)
            and name in info.validation_alias.choices
        ):
            return f"the same setting as '{field_name}'; give only one of them"
    allowed = [info.alias or field_name for field_name, info in fields.items()]  # as written
    close = difflib.get_close_matches(name, allowed, n=1)
    if close:
        return f"unknown key; did you mean '{close[0]}'?"
    return "unknown key; expected one of " + ", ".join(repr(a) for a in allowed)


def _fields_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> dict[str, FieldInfo] | None:
    """The fields of the model found by walking `loc` down from `root`, if it is a model."""
    node: Any = root
    for part in loc:
        node = _unoptional(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            info = node.model_fields.get(str(part))
            if info is None:
                return None
            node = info.annotation
        elif get_origin(node) is dict:
            node = get_args(node)[1]
        else:
            return None
    node = _unoptional(node)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return dict(node.model_fields)
    return None


def _unoptional(node: Any) -> Any:
    """``X`` for an ``X | None`` annotation (an optional block), else ``node``."""
    if get_origin(node) in (Union, UnionType):
        args = [arg for arg in get_args(node) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return node
