"""The embedded reference server: a small real inference server that answers the profiling
routes exactly as vLLM (per version era) or SGLang do.

``import servers.reference`` does not import torch; the engine imports it when it starts.
"""

from servers.reference.app import ReferenceServer, create_app, serve
from servers.reference.config import Faults, ReferenceConfig
from servers.reference.trace_files import forward_step_numbers, load_trace

__all__ = [
    "Faults",
    "ReferenceConfig",
    "ReferenceServer",
    "create_app",
    "forward_step_numbers",
    "load_trace",
    "serve",
]
