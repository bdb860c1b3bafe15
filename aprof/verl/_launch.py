"""aprof turned on in verl's ``main_ppo`` by configuration: the Hydra overrides that do it, and
the check of a verl config that holds aprof's block.

A verl run profiled by aprof has Ray's worker setup hook set to ``aprof.verl.hook.install``,
aprof's own configuration as a top-level ``aprof`` block of verl's config, and verl's own
profiler off (``aprof.verl.load`` gives all of it as ``VerlPlan.overrides``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from aprof._config import ProfilerConfig, load_config, read_config_file, show_value
from aprof._errors import ConfigError
from aprof.verl._config import _inherited, _rollout_unprofiled, _VerlMap

_HOOK = "++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=aprof.verl.hook.install"
_BLOCK = "aprof"

# Hydra's override grammar (hydra-core 1.3, OverrideLexer.g4): the characters of an unquoted
# value that are text whatever surrounds them ('$' left out: `${` starts an interpolation),
# and what a whole unquoted value reads as when it is not text: a number, a bool or null.
_PLAIN = re.compile(r"[A-Za-z0-9_\-/+.%*@?|]+")
_INT = r"(?:0|[1-9](?:_?[0-9])*)"
_POINT = rf"(?:{_INT}\.|{_INT}?\.[0-9](?:_?[0-9])*)"
_EXPONENT = rf"(?:(?:{_INT}|{_POINT})[eE][+-]?[0-9](?:_?[0-9])*)"
_NOT_TEXT = re.compile(rf"[+-]?(?:{_POINT}|{_EXPONENT}|{_INT}|inf|nan)|true|false|null", re.I)
# A dict key cannot be quoted: these characters are written escaped with a backslash.
_KEY_ESCAPED = re.compile(r"([\\()\[\]{}:=, \t])")
_KEY = re.compile(r"(?:[A-Za-z0-9_\-/+.$%*@?|]|\\[\\()\[\]{}:=, \t])+")


def hydra_value(obj: object) -> str:
    """``obj`` (None, bool, int, float, str, and lists and str-keyed dicts of them) as the value
    of a Hydra command-line override, which verl's composed config then holds as ``obj``.

    Text is single-quoted where Hydra would not read it back as the same text. Raises
    TypeError on another type, ValueError on a dict key Hydra cannot write (it quotes no key):
    empty, one that reads as a number, bool or null, or one holding a quote or a character
    outside ASCII's letters, digits and ``_-/+.$%*@?|\\()[]{}:=,``, space and tab.
    """
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "true" if obj else "false"
    if isinstance(obj, int):
        return str(int(obj))
    if isinstance(obj, float):
        return repr(float(obj))
    if isinstance(obj, str):
        return _text(obj)
    if isinstance(obj, list):
        return "[" + ",".join(hydra_value(item) for item in obj) + "]"
    if isinstance(obj, Mapping):
        pairs = (f"{_key(key)}:{hydra_value(value)}" for key, value in obj.items())
        return "{" + ",".join(pairs) + "}"
    raise TypeError(f"a Hydra override value cannot hold a {type(obj).__name__}")


def _text(text: str) -> str:
    # OmegaConf, which holds the composed config, reads `${` as an interpolation: `\${` is a
    # literal one, and the backslashes before it are doubled.
    text = re.sub(r"(\\*)\$\{", lambda m: m[1] * 2 + "\\${", text)
    if _PLAIN.fullmatch(text) and not _NOT_TEXT.fullmatch(text):
        return text
    # In Hydra's quoted text a backslash escapes only a quote, or another backslash before a
    # quote or at the end.
    text = re.sub(r"(\\*)'", lambda m: m[1] * 2 + "\\'", text)
    text = re.sub(r"(\\+)\Z", lambda m: m[1] * 2, text)
    return f"'{text}'"


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"a Hydra dict key must be text, got {show_value(key)}")
    written = _KEY_ESCAPED.sub(r"\\\1", key)
    if not _KEY.fullmatch(written) or _NOT_TEXT.fullmatch(key):
        raise ValueError(f"{key!r}: Hydra cannot write this dict key (it quotes no key)")
    return written


def launch_overrides(config: ProfilerConfig) -> tuple[str, ...]:
    """The Hydra overrides that turn aprof on in verl's ``main_ppo``, profiling as ``config``
    says: Ray's worker setup hook, then the ``aprof`` block (``config`` with its save_path
    made absolute against the current folder: verl's TaskRunner runs in another)."""
    return _HOOK, f"++{_BLOCK}={hydra_value(_plain(config))}"


def _plain(config: ProfilerConfig) -> dict[str, Any]:
    """``config`` as JSON data, save_path absolute: only what differs from the defaults when
    that loads back as the same config, else every key."""
    profiler = config.global_profiler
    absolute = config.model_copy(
        update={
            "global_profiler": profiler.model_copy(
                update={"save_path": profiler.save_path.absolute()}
            )
        }
    )
    # An absolute save_path always differs from the default (relative) one, so it is kept.
    short = absolute.model_dump(mode="json", exclude_defaults=True)
    return short if load_config(short) == absolute else absolute.model_dump(mode="json")


def verl_mapping(cfg: Mapping[Any, object] | str | os.PathLike[str]) -> Mapping[Any, object]:
    """A verl config given as a mapping, or read from a YAML file; raises ConfigError naming
    the file when it cannot be read or is not a mapping."""
    if not isinstance(cfg, str | os.PathLike):
        return cfg
    data = read_config_file(cfg)
    if not isinstance(data, Mapping):
        raise ConfigError(str(cfg), "a verl config must be a mapping at the top level")
    return data


def aprof_config(
    verl_cfg: Mapping[Any, object] | str | os.PathLike[str],
) -> ProfilerConfig | None:
    """The aprof configuration a resolved verl config (a mapping or a YAML file) holds, its
    ``aprof`` block, checked as verl's trainer checks it at launch; None when it holds none.

    Raises ConfigError naming the key (``aprof.…`` for the block's own) when the block is not a
    valid aprof config, its save_path is relative, verl's own profiler would still drive
    captures (``global_profiler.steps``), or aprof profiles the rollout while verl would launch
    its servers without their profiling routes.
    """
    verl_cfg = verl_mapping(verl_cfg)
    if _BLOCK not in verl_cfg:
        return None
    block = verl_cfg[_BLOCK]
    if not isinstance(block, Mapping):
        raise ConfigError(_BLOCK, f"expected a mapping (aprof's config), got {show_value(block)}")
    try:
        config = load_config(block)
    except ConfigError as exc:
        key = exc.key or ""
        raise ConfigError(
            _BLOCK + (key if key[:1] in ("", "[") else "." + key), exc.reason
        ) from None
    save_path = config.global_profiler.save_path
    if not save_path.is_absolute():
        raise ConfigError(
            f"{_BLOCK}.global_profiler.save_path",
            f"must be absolute, got {str(save_path)!r}: verl's TaskRunner runs in another folder "
            "(aprof launch-args --verl writes it absolute)",
        )
    m = _VerlMap(verl_cfg)
    steps = m.get("global_profiler.steps")
    if steps not in (None, []):
        raise ConfigError(
            "global_profiler.steps",
            "verl's own profiler would capture the steps listed too; set it to null "
            f"({_BLOCK}.global_profiler.steps selects aprof's)",
        )
    if config.rollout.enable:
        enable, path = _inherited(m, "enable")
        why = (
            (
                path,
                f"{show_value(enable)}: verl profiles the rollout only when enabled (set it true)",
            )
            if enable is not True
            else _rollout_unprofiled(m, m.get("global_profiler.tool"))
        )
        if why is not None:
            raise ConfigError(
                why[0],
                f"{why[1]}; else verl launches its rollout servers without the profiling "
                f"routes {_BLOCK}.rollout.enable=true needs (or set that to false)",
            )
    return config
