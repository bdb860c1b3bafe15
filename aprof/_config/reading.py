"""Reading a config file or text, bounded: its size, aliases, values, depth and digits."""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from aprof._config.steps import key_member, show_value
from aprof._errors import ConfigError, FileTooLargeError, NotRegularFileError
from aprof._safe_files import read_regular

MAX_CONFIG_BYTES = 1024**2
"""Largest config file (or YAML text) read: 1 MiB. verl's composed trainer configs are tens of
kB; YAML parsing in Python takes about 10 s per MiB on a slow core."""
MAX_ALIASES = 100
"""Most YAML aliases (`*name`) one config may use."""
MAX_VALUES = 1_000_000
"""Most values (scalars, lists, mappings) a config may hold once YAML aliases (and sub-objects
a mapping passed in shares) are expanded: a 526-byte alias bomb expands to 387 million."""
MAX_DEPTH = 100
"""Most levels a config may nest (aprof's own keys nest 5 deep, verl's about 8)."""
MAX_INT_DIGITS = 100
"""Most digits of an integer in a config file; Python's int() is slow on long ones and refuses
more than 4300."""


def is_path(text: str) -> bool:
    if "\n" in text:
        return False
    # os.path.exists, not Path.exists: it answers False for over-long or NUL-holding names.
    return os.path.exists(text) or text.endswith((".yaml", ".yml", ".json"))


def parse_text(text: str) -> object:
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            None, f"YAML text longer than {MAX_CONFIG_BYTES} characters (the limit of a config)"
        )
    return _parse_yaml(text, None)


def read_config_file(path: str | os.PathLike[str]) -> object:
    """The parsed content of a YAML or JSON file, as plain dicts and lists.

    Raises ConfigError naming the file if it is not a regular file, is larger than
    MAX_CONFIG_BYTES, cannot be parsed or exceeds a limit on its content (aliases, values,
    nesting, integer digits).
    """
    path = Path(path)
    # Errors name the file; one that would break the line is quoted.
    where = str(path) if str(path).isprintable() else repr(str(path))
    try:
        text = _read_bounded(path, where).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"not UTF-8 text ({exc.reason})") from None
    if path.suffix == ".json":
        return _parse_json(text, where)
    return _parse_yaml(text, where)


def _read_bounded(path: Path, where: str) -> bytes:
    """The bytes of a regular file of at most MAX_CONFIG_BYTES; ConfigError naming `where`."""
    try:
        return read_regular(path, MAX_CONFIG_BYTES)
    except ValueError:  # what os.open raises for a NUL in the name
        raise ConfigError(where, "cannot read: a file name cannot hold a NUL character") from None
    except FileTooLargeError:
        reason = f"larger than {MAX_CONFIG_BYTES} bytes (the limit of a config file)"
        raise ConfigError(where, reason) from None
    except NotRegularFileError as exc:
        raise ConfigError(where, str(exc.strerror)) from None
    except OSError as exc:
        raise ConfigError(where, f"cannot read: {exc.strerror or exc}") from None


def _parse_json(text: str, origin: str) -> object:
    try:
        data = json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        reason = f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        raise ConfigError(origin, reason) from None
    except ConfigError as exc:  # from the hooks, which do not know the file
        raise ConfigError(origin, f"invalid JSON: {exc.reason}") from None
    except RecursionError:
        raise ConfigError(origin, _too_deep()) from None  # as to_plain says it
    return to_plain(data, origin)


def _json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    # json.loads alone keeps the last value of a key given twice.
    data: dict[str, object] = {}
    for key, value in pairs:
        if key in data:
            raise ConfigError(None, f"key {key!r} given twice in one object")
        data[key] = value
    return data


def _json_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ConfigError(None, _too_long(digits))
    return int(text)


def _too_deep() -> str:
    return f"nested more than {MAX_DEPTH} levels deep (the limit of a config)"


def _too_long(digits: int) -> str:
    return f"an integer of {digits} digits (the limit of a config is {MAX_INT_DIGITS})"


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (yaml keeps the last), more than
    MAX_ALIASES aliases, nodes nested deeper than MAX_DEPTH and integers of more than
    MAX_INT_DIGITS digits."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        # Checked while composing, before anything is expanded.
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # untyped stub
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                limit = f"more than {MAX_ALIASES} aliases (the limit of a config)"
                raise yaml.composer.ComposerError(None, None, limit, mark)
        elif self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, _too_deep(), mark)
        self._depth += 1
        node = super().compose_node(parent, index)
        self._depth -= 1
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, KeyError, IndexError, AttributeError):
            # What SafeLoader's scalar constructors raise on `!!int abc`, `!!bool x`, `!!float ''`,
            # `!!timestamp x` or the date 2001-02-30.
            tag = node.tag.removeprefix("tag:yaml.org,2002:")
            reason = f"not a valid {tag}: {show_value(node.value)}"
            raise yaml.constructor.ConstructorError(None, None, reason, node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        # Not a mapping node (`!!set [1]`): SafeLoader says so.
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key_node.value!r} given twice", key_node.start_mark
                    )
                seen.add(ident)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = len(node.value.lstrip("+-").replace("_", ""))
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(None, None, _too_long(digits), node.start_mark)
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _parse_yaml(text: str, origin: str | None) -> object:
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["unreadable"])[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(origin, f"invalid YAML{where}: {problem}") from None
    return to_plain(data, origin)


def to_plain(value: object, origin: str | None = None, *, at: str | None = None) -> object:
    """OmegaConf containers (and any Mapping / Sequence) as plain dicts and lists.

    Raises ConfigError naming `origin` past MAX_VALUES values or MAX_DEPTH levels: a sub-object
    that appears several times (a YAML alias, a list shared in a mapping passed in) counts each
    time, and the walk stops at the limit instead of expanding everything first. Anything a
    container other than a dict, list or tuple raises while it is read (OmegaConf's
    ``MissingMandatoryValue`` for a ``???``, an interpolation it cannot resolve) is one
    ConfigError naming the key path (below `at`, the key path of `value` itself, when given).
    """
    count = 0
    keys: list[object] = []  # the key path of the value being read

    def read(get: Callable[..., Any], *args: object) -> Any:
        try:
            return get(*args)
        except Exception as exc:  # a foreign container's own error: one error type out
            where = (at or "") + "".join(map(key_member, keys))
            raise ConfigError(where.removeprefix(".") or origin, _cannot_read(exc)) from None

    def walk(value: object, depth: int) -> object:
        nonlocal count
        count += 1
        if count > MAX_VALUES:
            reason = f"more than {MAX_VALUES} values with aliases expanded (the limit of a config)"
            raise ConfigError(origin, reason)
        if depth > MAX_DEPTH:
            raise ConfigError(origin, _too_deep())
        if isinstance(value, Mapping):
            plain = type(value) is dict
            data = {}
            for key in value if plain else read(list, value):
                keys.append(key)
                data[key] = walk(
                    value[key] if plain else read(operator.getitem, value, key), depth + 1
                )
                keys.pop()
            return data
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            plain = type(value) in (list, tuple)
            items = []
            for index in range(len(value) if plain else read(len, value)):
                keys.append(index)
                item = value[index] if plain else read(operator.getitem, value, index)
                items.append(walk(item, depth + 1))
                keys.pop()
            return items
        return value

    return walk(value, 1)


def _cannot_read(exc: Exception) -> str:
    """What a container raised while read, on one line: its type, its message's first line."""
    lines = str(exc).strip().splitlines()
    return f"cannot be read: {type(exc).__name__}" + (f": {lines[0]}" if lines else "")
