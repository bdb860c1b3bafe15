"""Loading a config: a path, a mapping or YAML text, validated into a ProfilerConfig."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from aprof._config.errors import config_error
from aprof._config.models import ProfilerConfig
from aprof._config.reading import is_path, parse_text, read_config_file, to_plain
from aprof._config.steps import show_value
from aprof._errors import ConfigError

ConfigSource = str | os.PathLike[str] | Mapping[str, object] | ProfilerConfig | None


def load_config(source: ConfigSource = None) -> ProfilerConfig:
    """Load and validate a config from a file path, a mapping or YAML text.

    None or `{}` gives the defaults; a ProfilerConfig is returned as is. A `str` is a file
    path when it has no newline and the file exists or ends in .yaml/.yml/.json, else YAML.
    Raises ConfigError naming the key (or file) and the reason.
    """
    if isinstance(source, ProfilerConfig):
        return source
    data: object
    if source is None:
        data = {}
    elif isinstance(source, Mapping):
        _not_verl(source)  # before its values are read: verl's may hold a `???`, which raises
        data = to_plain(source)  # OmegaConf and other containers validate as dicts and lists do
    elif isinstance(source, os.PathLike):
        data = read_config_file(source)
    elif isinstance(source, str):
        data = read_config_file(source) if is_path(source) else parse_text(source)
    else:
        raise ConfigError(
            None, f"expected a file path, a mapping or YAML text, got {type(source).__name__}"
        )
    if data is None:  # an empty file or document
        data = {}
    if not isinstance(data, Mapping):
        plain_word = isinstance(source, str) and "\n" not in source
        hint = " (or the path of an existing file)" if plain_word else ""
        raise ConfigError(None, f"the top level must be a mapping{hint}, got {show_value(data)}")
    _not_verl(data)
    return _validate(data)


def _not_verl(data: Mapping[Any, Any]) -> None:
    """Raise ConfigError with the way to read it when `data` is a verl trainer config.

    Asks only for keys and the `global_profiler` block, never for another value: a container
    of verl's (OmegaConf's) raises on reading a `???` and answers `in` with False for one.
    """
    profiler = _member(data, "global_profiler")
    if isinstance(profiler, Mapping) and "_target_" in _keys(profiler):
        key = "global_profiler._target_"
    elif "actor_rollout_ref" in _keys(data):
        key = "actor_rollout_ref"
    else:
        return
    raise ConfigError(
        key,
        "a verl trainer config, not aprof's: read it with aprof.verl.load(cfg) "
        "(or aprof validate --verl / aprof launch-args --verl)",
    )


def _keys(data: Mapping[Any, Any]) -> list[Any]:
    """The keys of `data`; none when it cannot list them (to_plain then says why)."""
    try:
        return list(data)
    except Exception:  # a foreign container's own error
        return []


def _member(data: Mapping[Any, Any], key: str) -> object:
    """`data[key]`; None when missing or unreadable (to_plain then says why)."""
    try:
        return data[key] if key in _keys(data) else None
    except Exception:  # a foreign container's own error
        return None


def _validate(data: Mapping[Any, Any]) -> ProfilerConfig:
    try:
        return ProfilerConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, ProfilerConfig) from None
    except (TypeError, KeyError, RecursionError) as exc:  # belt and braces: one error type out
        raise ConfigError(None, f"invalid configuration: {exc}") from None
