"""servers: inference-server capture targets (vLLM, SGLang) and the embedded reference server."""

from servers._errors import (
    AnswerTooLargeError,
    LaunchError,
    ProfilingDisabledError,
    ServerError,
    SessionConflictError,
    UnsupportedError,
    VersionError,
)
from servers.engines import SGLangEngine, VLLMEngine
from servers.launch import LaunchSpec, launch_spec
from servers.process import LaunchedServer, launch
from servers.sglang import SGLangServer
from servers.vllm import VLLMServer

__all__ = [
    "AnswerTooLargeError",
    "LaunchError",
    "LaunchSpec",
    "LaunchedServer",
    "ProfilingDisabledError",
    "SGLangEngine",
    "SGLangServer",
    "ServerError",
    "SessionConflictError",
    "UnsupportedError",
    "VLLMEngine",
    "VLLMServer",
    "VersionError",
    "launch",
    "launch_spec",
]
