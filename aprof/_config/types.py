"""The field types of aprof's config: strict numbers, paths, step selections, index lists."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Annotated, Literal, get_args

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    PlainValidator,
    Strict,
    WithJsonSchema,
)

from aprof._config.steps import MAX_INT, StepSelection, is_int, show_value
from aprof._errors import ConfigError

# Strict: YAML already yields real ints and bools; `ranks: [true]` or `delay: 1.5` is a mistake.
StrictBool = Annotated[bool, Strict()]
PositiveInt = Annotated[int, Strict(), Field(gt=0, le=MAX_INT)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
# Each field gives its own range: `Field(default, ge=..., le=...)`.
Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]


def _parse_steps(value: object) -> StepSelection:
    # key="" makes error keys relative ("[2]", ".every"); the converter prefixes the field path.
    return StepSelection.parse(value, key="")


Steps = Annotated[
    StepSelection,
    PlainValidator(_parse_steps),
    PlainSerializer(lambda steps: steps.to_config()),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "null"},
                {"type": "integer", "minimum": 1},
                {"type": "array", "items": {"type": "integer", "minimum": 1}},
                {"type": "string", "examples": ["1-3,5"]},
                {"type": "object", "properties": {"every": {"type": "integer", "minimum": 1}}},
            ]
        }
    ),
]


def _path_text(value: object) -> object:
    if isinstance(value, str | PurePath):
        text = str(value)
        if not text.strip():
            raise ConfigError("", "must not be empty")
        # Either would pass here and fail later, when a file is created, with a raw error.
        if "\0" in text:
            raise ConfigError("", f"must not hold a NUL character, got {show_value(text)}")
        try:
            os.fsencode(text)
        except UnicodeEncodeError as exc:
            reason = f"{text[exc.start : exc.end]!r} cannot be in a file name here ({exc.reason})"
            raise ConfigError("", reason) from None
    return value


def _expand_home(path: Path) -> Path:
    # Without this, `~/prof` creates a folder named `~` in the working directory.
    try:
        return path.expanduser()
    except RuntimeError:  # `~name` of an unknown user, or no home at all
        raise ConfigError("", f"cannot find the home folder {path.parts[0]!r} stands for") from None


Pathname = Annotated[Path, BeforeValidator(_path_text), AfterValidator(_expand_home)]


def indices(what: str) -> Callable[[object], object]:
    """A before-validator for a list of distinct indices >= 0 (ranks, replicas)."""

    def check(value: object) -> object:
        if what == "replica" and value == "all":
            return value
        if not isinstance(value, list | tuple):
            expected = "'all' or a list of replica indices" if what == "replica" else "a list"
            raise ConfigError("", f"expected {expected}, got {show_value(value)}")
        seen: set[int] = set()
        for i, item in enumerate(value):
            if not is_int(item) or item < 0:
                raise ConfigError(f"[{i}]", f"expected a {what} index >= 0, got {show_value(item)}")
            if item > MAX_INT:
                raise ConfigError(f"[{i}]", f"must be <= {MAX_INT}, got {show_value(item)}")
            if item in seen:
                raise ConfigError(f"[{i}]", f"{what} {item} is listed twice")
            seen.add(item)
        return list(value)

    return check


def distinct_nonempty(values: list[str]) -> list[str]:
    if not values:
        raise ConfigError("", "must list at least one item")
    for i, value in enumerate(values):
        if value in values[:i]:
            raise ConfigError(f"[{i}]", f"{value!r} is listed twice")
    return values


TorchContent = Literal["cpu", "cuda", "shapes", "stack", "memory"]
NPUContent = Literal["npu", "cpu", "memory", "shapes", "module", "stack"]
TORCH_CONTENTS: tuple[TorchContent, ...] = get_args(TorchContent)
NPU_CONTENTS: tuple[NPUContent, ...] = get_args(NPUContent)
TORCH_DEFAULT: tuple[TorchContent, ...] = ("cpu", "cuda")
NPU_DEFAULT: tuple[NPUContent, ...] = ("npu", "cpu")
