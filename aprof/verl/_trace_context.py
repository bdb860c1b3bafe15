"""W3C trace context from verl's rollout client to vLLM, across verl's Ray call.

verl's agent loops reach a vLLM replica by a Ray call to its server actor
(``vLLMHttpServer.generate``), which takes no trace headers and passes none to the engine.
:func:`carry` (run by ``aprof.verl.hook`` in every Ray worker as verl's server module is
imported) gives that method one more keyword, ``aprof_trace_headers``, which it hands to the
engine's own ``generate(trace_headers=...)``: vLLM's request spans then carry the trace and
span of aprof's request. A call without the keyword is verl's own.

The server actors' OpenTelemetry exporter defaults to OTLP over HTTP/protobuf (what aprof's
receiver takes; the SDK's default is gRPC) and to batches every half second, unless their
environment says otherwise: it sends spans only where verl's config names an endpoint
(``engine_kwargs.vllm.otlp_traces_endpoint``, which aprof sets with ``otel.receive``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from types import ModuleType
from typing import Any

KEYWORD = "aprof_trace_headers"
"""The keyword aprof's verl client adds to ``generate``: ``traceparent`` and ``tracestate``."""
_HEADERS: ContextVar[Mapping[str, str] | None] = ContextVar("aprof_trace_headers", default=None)
"""The headers of the call this task runs (each Ray call of an async actor is a task)."""


_VERLS: dict[str, Any] = {}
"""verl's own ``generate`` of each server class :func:`carry` changed, by the class's
module and name (Ray may give the actor a copy of the class, or a subclass of it)."""


def carry(module: ModuleType) -> None:
    """Make ``module.vLLMHttpServer.generate`` take ``aprof_trace_headers`` (once)."""
    server = module.vLLMHttpServer
    name = _name(server)
    if name in _VERLS:
        return
    os.environ.setdefault("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")
    _VERLS[name] = server.generate
    server.generate = _generate


# A function of this module, not a closure: Ray pickles the server class with its methods
# (by reference, here). Ray checks a call's keywords against its signature: the keyword is
# explicit, and it is no wrapper of verl's (whose signature Ray would read instead).
async def _generate(
    self: Any, *args: Any, aprof_trace_headers: Mapping[str, str] | None = None, **kwargs: Any
) -> Any:
    """verl's ``generate``, with the engine given ``aprof_trace_headers`` as its
    ``trace_headers``."""
    verl = next(_VERLS[n] for n in map(_name, type(self).__mro__) if n in _VERLS)
    if aprof_trace_headers:
        _trace(self.engine)
    token = _HEADERS.set(aprof_trace_headers or None)
    try:
        return await verl(self, *args, **kwargs)
    finally:
        _HEADERS.reset(token)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _trace(engine: Any) -> None:
    """The engine's ``generate`` given the headers of the call it runs in (once per engine)."""
    if getattr(engine, "aprof_traced", False):
        return
    generate = engine.generate

    def traced(*args: Any, **kwargs: Any) -> Any:
        headers = _HEADERS.get()
        if headers is not None and kwargs.get("trace_headers") is None:
            kwargs["trace_headers"] = dict(headers)
        return generate(*args, **kwargs)

    engine.generate = traced
    engine.aprof_traced = True
