"""servers: inference-server capture targets (vLLM, SGLang) and the embedded reference server."""

from servers._http import AnswerTooLargeError, ServerError
from servers.engines import SGLangEngine, VLLMEngine
from servers.launch import LaunchSpec, launch_spec
from servers.process import LaunchedServer, LaunchError, launch
from servers.sglang import SGLangServer
from servers.vllm import ProfilingDisabledError, SessionConflictError, VLLMServer

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
    "VLLMEngine",
    "VLLMServer",
    "launch",
    "launch_spec",
]
