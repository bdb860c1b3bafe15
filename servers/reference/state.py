"""What every route of one reference server shares."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from servers.reference.config import ReferenceConfig
from servers.reference.engine import Engine
from servers.reference.metrics import Metrics


@dataclass
class ServerState:
    """The config, engine and metrics of one server, and the event that says it is closing."""

    cfg: ReferenceConfig
    engine: Engine
    metrics: Metrics
    closing: asyncio.Event = field(default_factory=asyncio.Event)


STATE = web.AppKey("reference_state", ServerState)
