"""``aprof.verl.ProfiledLLMServerClient``: verl 0.9.1's own ``LLMServerManager``, load balancer and
client, each call to the replica verl picked run as an aprof request (gated, counted)."""

# ruff: noqa: E402  (what follows the skips needs verl)

from __future__ import annotations

import asyncio
import importlib
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl.workers.rollout.llm_server", reason="nox -s verl installs verl 0.9.1")
ray = pytest.importorskip("ray")
from anyio.from_thread import start_blocking_portal
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

import aprof
from aprof.testing import RecordingTarget
from aprof.verl import ProfiledClientMixin, ProfiledLLMServerClient
from servers import launch, launch_spec
from servers.process import free_port
from servers.reference.tokenizer import encode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
example: Any = importlib.import_module("verl_agent_loop")
ray.cloudpickle.register_pickle_by_value(example)  # Ray's workers cannot import it

REQUESTS = 40


@pytest.fixture(scope="module")
def urls(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two reference servers, for the module."""
    logs = tmp_path_factory.mktemp("logs")
    with start_blocking_portal() as portal:
        specs = [launch_spec("reference", version="0.32.0", port=free_port()) for _ in range(2)]
        launched = []
        try:
            for r, spec in enumerate(specs):
                launched.append(
                    portal.call(lambda s=spec, r=r: launch(s, log_path=logs / f"{r}.log"))
                )
            yield [spec.base_url for spec in specs]
        finally:
            for server in launched:
                portal.call(server.aclose)


def profiler(tmp_path: Path) -> tuple[aprof.Profiler, list[RecordingTarget]]:
    cfg = {
        "global_profiler": {"steps": "1", "save_path": str(tmp_path)},
        "rollout": {"replicas": "all", "start": "on_first_request"},
    }
    prof = aprof.Profiler(cfg)
    # A start that takes a little time, as a server's does: the request that opens a window
    # waits for it (a start that needs no wait is over before that request goes on).
    targets = [RecordingTarget(f"replica_{r}", replica=r, start_latency=0.01) for r in range(2)]
    for target in targets:
        prof.add_target(target)
    return prof, targets


async def manager_over(urls: list[str], replica_cls: Any = None) -> Any:
    """verl's manager with the reference servers added through its load balancer."""
    config = example.verl_config(Path("unused"), [], 1)
    manager = await example.ReferenceServerManager.create_empty(config=config)
    actor = ray.remote(replica_cls or example.ReferenceReplica).options(num_cpus=0)
    await asyncio.to_thread(manager.add_reference_servers, {url: actor.remote(url) for url in urls})
    return manager


async def generate_all(client: Any, tag: str) -> list[TokenOutput]:
    calls = [
        client.generate(f"{tag}-{i}", prompt_ids=encode("hello"), sampling_params={"max_tokens": 4})
        for i in range(REQUESTS)
    ]
    return await asyncio.gather(*calls)


async def test_each_call_counts_in_the_window_of_the_replica_verl_picked(
    urls: list[str], tmp_path: Path
) -> None:
    prof, targets = profiler(tmp_path)
    async with prof:
        manager = await manager_over(urls)
        client = manager.get_client(
            client_cls=ProfiledLLMServerClient, profiler=prof, replicas=urls
        )
        async with prof.step(1):
            answered = await generate_all(client, "a")
        async with prof.step(2):
            await generate_all(client, "b")

    by_server = Counter(out.extra_fields["server"] for out in answered)
    assert sum(by_server.values()) == REQUESTS
    windows = {w.target: w for w in prof.manifest.windows}
    assert [w.step for w in prof.manifest.windows] == [1] * len(windows)  # step 2 not profiled
    for replica, url in enumerate(urls):
        if by_server[url]:  # verl's balancer spreads 40 concurrent calls over both
            window = windows[f"replica_{replica}"]
            assert window.state == "done"
            assert window.requests.admitted == by_server[url]
            assert window.requests.gated >= 1  # the request that opened the window waited
            assert len(targets[replica].starts) == 1
    # The tokens verl's calls carried and got back reach the accounting.
    step_1, step_2 = aprof.report(tmp_path, html=False).accounts
    for account in (step_1, step_2):
        assert sum(r.requests for r in account.replicas) == REQUESTS
        assert sum(r.prompt_tokens for r in account.replicas) == REQUESTS * len(encode("hello"))
    generated = sum(len(out.token_ids) for out in answered)
    assert generated > 0 and sum(r.tokens for r in step_1.replicas) == generated


async def test_a_server_outside_replicas_goes_unprofiled(urls: list[str], tmp_path: Path) -> None:
    prof, targets = profiler(tmp_path)
    async with prof:
        manager = await manager_over(urls)
        client = manager.get_client(
            client_cls=ProfiledLLMServerClient, profiler=prof, replicas=urls[:1]
        )
        async with prof.step(1):
            answered = await generate_all(client, "c")
    by_server = Counter(out.extra_fields["server"] for out in answered)
    assert by_server[urls[1]] > 0  # verl still routed there
    assert not targets[1].starts
    windows = {w.target: (w.state, w.requests.admitted) for w in prof.manifest.windows}
    assert windows == {"replica_0": ("done", by_server[urls[0]]), "replica_1": ("skipped", 0)}


class AbortsFirst(example.ReferenceReplica):  # type: ignore[misc]
    """A replica that aborts the first call it gets after two tokens, as a replica does when
    verl pauses it for a weight sync."""

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any
    ) -> TokenOutput:
        if not getattr(self, "aborted_one", False):
            self.aborted_one = True
            return TokenOutput(token_ids=encode("ab"), stop_reason="aborted")
        return await super().generate(request_id, prompt_ids, sampling_params, **kw)


class ProfiledResumingClient(ProfiledClientMixin, FullyAsyncLLMServerClient):  # type: ignore[misc]
    """verl's resuming client with aprof's mixin: each attempt is a request of its own."""


async def test_the_mixin_on_verls_resuming_client_counts_each_attempt(
    urls: list[str], tmp_path: Path
) -> None:
    prof, _ = profiler(tmp_path)
    async with prof:
        manager = await manager_over(urls[:1], AbortsFirst)
        client = manager.get_client(
            client_cls=ProfiledResumingClient, profiler=prof, replicas=urls[:1]
        )
        async with prof.step(1):
            answered = await client.generate(
                "resumed", prompt_ids=encode("hello"), sampling_params={"max_tokens": 6}
            )
    assert answered.token_ids[:2] == encode("ab") and len(answered.token_ids) == 6
    (window,) = [w for w in prof.manifest.windows if w.state == "done"]
    assert window.target == "replica_0"
    assert window.requests.admitted == 2  # the aborted attempt and the resumed one


def test_verls_generate_and_its_tracing_are_kept() -> None:
    assert ProfiledLLMServerClient.generate is LLMServerClient.generate


def test_wrong_arguments_are_named() -> None:
    with pytest.raises(TypeError, match=r"profiler= takes aprof\.ray\.share"):
        ProfiledLLMServerClient(config=None, profiler=object(), replicas=["a"])
    with pytest.raises(TypeError, match="replicas= takes the servers' addresses"):
        ProfiledLLMServerClient(config=None, profiler=aprof.Profiler(), replicas="http://a")
    with pytest.raises(ValueError, match=r"replicas\[1\] must be a new server address"):
        ProfiledLLMServerClient(config=None, profiler=aprof.Profiler(), replicas=["a", "a"])


class VerlTrainer:
    """verl 0.9.1's ``RayPPOTrainer.init_workers`` as far as the agent loops go: the server
    manager first, then the agent-loop manager of the class verl's config names (made by its
    constructor here: ``create`` would also start verl's own agent-loop workers)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.config = example.verl_config(Path("unused"), [], 1)

    def init_workers(self) -> None:
        self.llm_server_manager = asyncio.run(manager_over(self.urls))
        self.async_rollout_manager = aprof.verl.ProfiledAgentLoopManager(
            config=self.config, llm_client=self.llm_server_manager.get_client()
        )


class Trainer(aprof.verl.ProfiledTrainerMixin, VerlTrainer):
    pass


def test_the_agent_loop_manager_verls_config_names_gets_a_profiled_client(
    urls: list[str], tmp_path: Path
) -> None:
    trainer = Trainer(urls)
    cfg = {
        "global_profiler": {"steps": "1", "save_path": str(tmp_path)},
        "rollout": {"replicas": "all", "start": "on_first_request"},
    }
    with aprof.BlockingProfiler(cfg) as prof:
        for r in range(2):
            prof.add_target(RecordingTarget(f"replica_{r}", replica=r))
        trainer.aprof_profiler = prof
        trainer.init_workers()
        client = trainer.async_rollout_manager.llm_client
        assert isinstance(client, ProfiledLLMServerClient)
        assert client.aprof_replicas == {url: r for r, url in enumerate(urls)}
        # What verl's agent-loop workers do with it, in their own process.
        worker = ray.remote(Generates).options(num_cpus=0).remote(client)
        with prof.step(1):
            answered = ray.get(worker.generate_all.remote(), timeout=120)
    by_server = Counter(out.extra_fields["server"] for out in answered)
    admitted = {w.target: w.requests.admitted for w in prof.manifest.windows if w.state == "done"}
    assert sum(admitted.values()) == REQUESTS
    assert admitted == {
        f"replica_{r}": by_server[url] for r, url in enumerate(urls) if by_server[url]
    }
    assert not [note.text for note in prof.manifest.notes]


class Generates:
    """A Ray actor sending requests through the client it was given, as verl's workers do."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def generate_all(self) -> list[TokenOutput]:
        return await generate_all(self.client, "w")


def test_the_manager_without_the_trainer_mixin_leaves_verls_client(urls: list[str]) -> None:
    manager = asyncio.run(manager_over(urls))
    client = manager.get_client()
    loops = aprof.verl.ProfiledAgentLoopManager(config=manager.config, llm_client=client)
    assert loops.llm_client is client
