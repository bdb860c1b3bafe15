"""verl's rollout client with aprof: each call to a server replica is an aprof request.

verl's ``LLMServerClient`` picks a replica inside ``_acquire_server`` (a call to its load
balancer) and then calls the replica's ``generate``. The mixin takes the replica verl picked
and runs that call inside ``request(replica=..., request_id=...)`` of the process's profiler:
gated while the replica's capture starts, counted into its window, on the timeline. verl's
own ``generate`` (with its ``@rollout_trace_op``) is not replaced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from typing import Any

from verl.workers.rollout.llm_server import LLMServerClient

from aprof._errors import TargetError
from aprof._logging import logger
from aprof.abc import RolloutProfiler
from aprof.ray._remote import connect
from aprof.ray._share import ShareHandle
from aprof.verl._trace_context import KEYWORD

_MIXED: dict[type, type] = {}
"""The mixin's subclass of each verl client class :func:`profiled` met (filled below)."""
_JOINED: dict[str, RolloutProfiler] = {}
"""This process's profiler per shared run: every client copy in a process joins it once."""


class ProfiledClientMixin:
    """Put before a verl client class (``LLMServerClient``, ``FullyAsyncLLMServerClient``)
    so that each call to a replica runs inside an aprof request.

    Takes, besides the client's own arguments (what ``LLMServerManager.get_client`` passes
    on): ``profiler``, ``aprof.ray.share(prof)``'s handle (each process the client is sent to
    joins the driver's profiler on its first request) or a profiler of this process; and
    ``replicas``, the servers' addresses in replica order (``manager.get_addresses()``) or a
    mapping of address to replica index.
    """

    def __init__(
        self,
        *args: Any,
        profiler: ShareHandle | RolloutProfiler,
        replicas: Sequence[str] | Mapping[str, int],
        role: str = "agent_loop_worker",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._aprof_setup(profiler, replicas, role)

    def _aprof_setup(
        self,
        profiler: ShareHandle | RolloutProfiler,
        replicas: Sequence[str] | Mapping[str, int],
        role: str,
    ) -> None:
        if not isinstance(profiler, ShareHandle) and not callable(
            getattr(profiler, "request", None)
        ):
            raise TypeError(
                "profiler= takes aprof.ray.share(prof)'s handle or a profiler with "
                f"request(replica=, request_id=), not {profiler!r}"
            )
        if isinstance(replicas, str) or not isinstance(replicas, Sequence | Mapping):
            raise TypeError(
                "replicas= takes the servers' addresses in replica order "
                f"(manager.get_addresses()) or a mapping address -> replica, not {replicas!r}"
            )
        self.aprof_profiler = profiler
        self.aprof_role = role
        self.aprof_replicas: dict[str, int] = (
            dict(replicas) if isinstance(replicas, Mapping) else _indexed(replicas)
        )
        self._aprof_unknown: set[str] = set()
        self.aprof_trace_context = False
        """Each call sends the request's W3C trace context (the servers take it: see
        ``aprof.verl._trace_context``)."""

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        server_id, server = await super()._acquire_server(request_id, **extra)  # type: ignore[misc]
        replica = self.aprof_replicas.get(server_id)
        if replica is None:
            if server_id not in self._aprof_unknown:  # said once per server
                self._aprof_unknown.add(server_id)
                logger.warning(
                    "aprof: server not in replicas=, its requests are not profiled",
                    server=server_id,
                )
            return server_id, server
        profiled = _ProfiledServer(server, self._aprof_joined(), replica, self.aprof_trace_context)
        return server_id, profiled

    def _aprof_joined(self) -> RolloutProfiler:
        """The profiler of this process: joined on first use when given a handle."""
        source = self.aprof_profiler
        if not isinstance(source, ShareHandle):
            return source
        joined = _JOINED.get(source.run_id)
        if joined is None:
            joined = _JOINED[source.run_id] = connect(source, role=self.aprof_role)
        return joined


class ProfiledLLMServerClient(ProfiledClientMixin, LLMServerClient):  # type: ignore[misc]
    """verl's ``LLMServerClient`` whose calls to replicas are aprof requests: pass it to
    ``LLMServerManager.get_client(client_cls=..., profiler=..., replicas=...)``."""


_MIXED[LLMServerClient] = ProfiledLLMServerClient


class _ProfiledServer:
    """A replica's handle whose ``generate.remote(...)`` runs inside an aprof request; its
    other methods are the replica's own."""

    def __init__(
        self, server: Any, profiler: RolloutProfiler, replica: int, trace_context: bool
    ) -> None:
        self._server = server
        self.generate = _ProfiledGenerate(server, profiler, replica, trace_context)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _ProfiledGenerate:
    def __init__(
        self, server: Any, profiler: RolloutProfiler, replica: int, trace_context: bool
    ) -> None:
        self._server = server
        self._profiler = profiler
        self._replica = replica
        self._trace_context = trace_context

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """As the Ray method's ``remote``: something to await for the replica's answer."""
        return self._call(args, kwargs)

    async def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # The id the server sees (verl makes a new one per turn): it names the request in
        # the server's own trace too.
        request_id = kwargs.get("request_id")
        async with self._profiler.request(
            replica=self._replica, request_id=None if request_id is None else str(request_id)
        ) as req:
            if self._trace_context and req.traceparent is not None:
                headers = {"traceparent": req.traceparent}
                if req.tracestate is not None:
                    headers["tracestate"] = req.tracestate
                kwargs = {**kwargs, KEYWORD: headers}
            answer = await self._server.generate.remote(*args, **kwargs)
            # verl's generate takes the prompt's ids and answers with the generated ones.
            req.prompt_tokens = _length(kwargs.get("prompt_ids"))
            req.forward(tokens=_length(getattr(answer, "token_ids", None)))
            return answer


def profiled(
    client: Any,
    *,
    profiler: ShareHandle | RolloutProfiler,
    replicas: Sequence[str],
    trace_context: bool = False,
) -> Any:
    """``client``, an instance of a verl client class, as an instance of that class with the
    mixin: its state kept, its calls to replicas profiled; with ``trace_context``, each call
    sends its request's W3C trace context (servers patched by ``aprof.verl.hook``)."""
    base = type(client)
    mixed = _MIXED.get(base)
    if mixed is None:
        name = f"Profiled{base.__name__}"
        mixed = _MIXED[base] = type(name, (ProfiledClientMixin, base), {"__qualname__": name})
    wrapped: ProfiledClientMixin = object.__new__(mixed)
    wrapped.__dict__.update(client.__dict__)  # made by the client's own constructor
    wrapped._aprof_setup(profiler, replicas, "agent_loop_worker")
    wrapped.aprof_trace_context = trace_context
    return wrapped


def _length(ids: object) -> int:
    """How many token ids ``ids`` holds; 0 when it is no sequence of them."""
    return len(ids) if isinstance(ids, Sized) and not isinstance(ids, str | bytes) else 0


def _indexed(addresses: Sequence[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    for replica, address in enumerate(addresses):
        if not isinstance(address, str) or address in index:
            raise TargetError(f"replicas[{replica}] must be a new server address, got {address!r}")
        index[address] = replica
    return index
