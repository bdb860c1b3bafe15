"""aprof's configuration: its models, its field types, reading a config bounded, loading one,
and pydantic's errors as one :class:`~aprof.ConfigError` (verl's config: ``aprof/verl/``).

- ``models.py``: one pydantic model per section, ``ProfilerConfig`` the whole;
- ``types.py``: the field types (strict numbers, paths, step selections, index lists);
- ``steps.py``: the step-selection syntax (``[1, 2]``, ``"1-3,5"``, ``{every: k}``);
- ``reading.py``: a file or YAML text into plain data, within bounds on size and content;
- ``load.py``: :func:`load_config`, any source into a validated ``ProfilerConfig``;
- ``errors.py``: a ``ValidationError`` as one ``ConfigError`` naming the key.
"""

from aprof._config.errors import config_error
from aprof._config.load import ConfigSource, load_config
from aprof._config.models import (
    ColocatedConfig,
    ControlConfig,
    ControlHTTPConfig,
    GlobalProfilerConfig,
    LimitsConfig,
    LogConfig,
    NPUToolConfig,
    NsysToolConfig,
    OtelConfig,
    ProfilerConfig,
    RoleConfig,
    RolloutConfig,
    ScheduleConfig,
    SlowTriggerConfig,
    TimelineConfig,
    TimeoutsConfig,
    ToolConfig,
    TorchMemoryToolConfig,
    TorchToolConfig,
    TriggersConfig,
)
from aprof._config.reading import read_config_file, to_plain
from aprof._config.steps import StepSelection, key_member, show_value
from aprof._config.types import NPU_CONTENTS, TORCH_CONTENTS

__all__ = [
    "NPU_CONTENTS",
    "TORCH_CONTENTS",
    "ColocatedConfig",
    "ConfigSource",
    "ControlConfig",
    "ControlHTTPConfig",
    "GlobalProfilerConfig",
    "LimitsConfig",
    "LogConfig",
    "NPUToolConfig",
    "NsysToolConfig",
    "OtelConfig",
    "ProfilerConfig",
    "RoleConfig",
    "RolloutConfig",
    "ScheduleConfig",
    "SlowTriggerConfig",
    "StepSelection",
    "TimelineConfig",
    "TimeoutsConfig",
    "ToolConfig",
    "TorchMemoryToolConfig",
    "TorchToolConfig",
    "TriggersConfig",
    "config_error",
    "key_member",
    "load_config",
    "read_config_file",
    "show_value",
    "to_plain",
]
