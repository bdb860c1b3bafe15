"""The driver's side of a run over several Ray nodes: the nodes' clocks, measured as the
run is shared, when a process first reports, at each step with rollout windows and at
close; and, at close, the run's files on every node listed (``cluster.collect: on_close``:
brought into the driver's ``save_path``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aprof._config import ProfilerConfig
from aprof._core.serving import Serving
from aprof._errors import describe
from aprof._logging import logger
from aprof.ray._clocks import HostClocks
from aprof.ray._collect import gather
from aprof.ray._nodes import AGENT_S, Nodes


class Cluster:
    """The nodes of one shared run, as its driver sees them."""

    def __init__(self, serving: Serving, save_path: Path, run_id: str) -> None:
        config: ProfilerConfig = serving.config
        self._serving = serving
        self._save_path = save_path
        self._config = config
        self._nodes = Nodes(str(save_path), run_id, max(AGENT_S, config.timeouts.connect_s))
        self._clocks = HostClocks(self._nodes.driver)
        self._measuring: asyncio.Task[None] | None = None

    def measure_soon(self) -> None:
        """Measure every node's clock now, in the background, unless a measurement runs."""
        if self._measuring is None or self._measuring.done():
            self._measuring = asyncio.get_running_loop().create_task(
                self._measure(), name="aprof-clocks"
            )

    async def _measure(self) -> None:
        try:
            await asyncio.to_thread(self._nodes.measure, self._clocks)
        except Exception as exc:  # the run goes on with the clocks measured before
            logger.warning("aprof clocks not measured", error=describe(exc))
            return
        self._serving.hosts_and_files(self._clocks.records(), None, [])

    async def last_word(self) -> None:
        """Measure the clocks a last time, list the run's files on every node (bringing them
        in with ``cluster.collect: on_close``) and hand both to the manifest: the listing and
        collection bounded by ``cluster.collect_s``, each clock probe by ``AGENT_S``."""
        if self._measuring is not None:
            await asyncio.wait({self._measuring}, timeout=self._nodes.call_s)
        cluster = self._config.cluster
        fetch = cluster.collect == "on_close"
        known = self._serving.listed_files()
        try:
            await asyncio.to_thread(self._nodes.measure, self._clocks)
            done = await asyncio.to_thread(
                gather, self._save_path, self._nodes, known, limit_s=cluster.collect_s, fetch=fetch
            )
        except Exception as exc:
            logger.warning("aprof run files not listed", error=describe(exc))
            self._serving.hosts_and_files(self._clocks.records(), None, [])
            return
        finally:
            await asyncio.to_thread(self._nodes.close)
        if fetch:
            logger.info(
                "aprof collected the run's files",
                fetched=done.fetched,
                bytes=done.fetched_bytes,
                present=done.present,
            )
        self._serving.hosts_and_files(self._clocks.records(), done.files, done.notes)
