"""verl 0.9.1's own agent loop in Ray workers, profiled by aprof from a synchronous trainer, on CPU.

What is verl's here: the trainer config (read by ``aprof.verl.load``), ``LLMServerManager`` and
its global load balancer (verl's routing), the rollout client (verl's ``LLMServerClient`` with
aprof's mixin, from ``get_client(client_cls=...)``) and ``SingleTurnAgentLoop``, imported from
the installed verl and run unchanged. What stands in for a GPU cluster: two ``aprof
serve-reference`` servers (a tiny real model, vLLM's profiling routes), each behind a Ray
actor with the ``generate`` method verl's server actors have, and a character-level tokenizer
matching the reference model's vocabulary.

The trainer loop is synchronous, as verl's ``RayPPOTrainer.fit()``: ``aprof.BlockingProfiler``
with ``with prof.step(n):``, and verl's own ``asyncio.run`` calls (``auto_await``) in between.
The table at the end shows each rollout window with the requests the agent-loop workers
counted in it.

Needs verl 0.9.1 and what its agent-loop modules import on CPU (see docs/verl.md).
Run: python examples/verl_agent_loop.py --out outputs/verl-agents --steps 1,3 --num-steps 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import ray
from anyio.from_thread import start_blocking_portal
from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import TokenOutput

import aprof
import aprof.ray
import aprof.verl
from servers import launch, launch_spec
from servers.process import free_port
from servers.reference.tokenizer import VOCAB, encode

REPLICAS = 2
REFERENCE_VERSION = "0.32.0"
QUESTIONS = (
    "What is 2+2?",
    "Name a prime number.",
    "Why is the sky blue?",
    "Spell 'profile' backwards.",
)


def verl_config(out: Path, steps: list[int], workers: int) -> DictConfig:
    """The parts of a verl trainer config this run reads: the profiler blocks aprof maps,
    and the rollout settings verl's client and agent loop read."""
    return OmegaConf.create(
        {
            "global_profiler": {"tool": "torch", "steps": steps, "save_path": str(out)},
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "nnodes": 1,
                    "prompt_length": 128,
                    "response_length": 16,
                    "full_determinism": False,
                    "disaggregation": {"enabled": False},
                    "agent": {"num_workers": workers},
                    "profiler": {
                        "enable": True,
                        "all_ranks": True,
                        "tool_config": {"torch": {"discrete": True}},
                    },
                },
                "model": {},
            },
            "data": {},
        }
    )


class ReferenceReplica:
    """A Ray actor over one reference server, with the ``generate`` verl's server actors have:
    token IDs in, token IDs out."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session: aiohttp.ClientSession | None = None

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **_multimodal: Any,
    ) -> TokenOutput:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        body = {"prompt": prompt_ids, "max_tokens": sampling_params.get("max_tokens", 16)}
        async with self.session.post(f"{self.url}/v1/completions", json=body) as response:
            response.raise_for_status()
            choice = (await response.json())["choices"][0]
        return TokenOutput(
            token_ids=encode(choice["text"]),
            stop_reason=choice["finish_reason"],
            extra_fields={"server": self.url},
        )


class AgentLoopWorker:
    """A Ray actor running verl's ``SingleTurnAgentLoop``, as verl's ``AgentLoopWorker`` does,
    with the client the driver made (it joins the driver's profiler on its first request)."""

    def __init__(self, config: DictConfig, llm_client: Any) -> None:
        # The reference model has no model family: verl's default token builder is the right
        # one, and it would say so at every agent loop.
        logging.getLogger("verl.utils.tokenizer.continuous_token_wiring").setLevel(logging.ERROR)
        self.config = config
        self.llm_client = llm_client
        self.tokenizer = char_tokenizer()

    async def generate_sequences(self, step: int, samples: int) -> int:
        """Run ``samples`` agent loops of ``step`` at once; how many failed."""
        runs = [self._run(QUESTIONS[i % len(QUESTIONS)]) for i in range(samples)]
        results = await asyncio.gather(*runs, return_exceptions=True)
        return sum(isinstance(r, BaseException) for r in results)

    async def _run(self, question: str) -> Any:
        loop = SingleTurnAgentLoop(
            trainer_config=DictConfigWrap(self.config),
            server_manager=self.llm_client,
            tokenizer=self.tokenizer,
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(self.config.data),
        )
        return await loop.run(
            {"temperature": 1.0, "max_tokens": 8},
            raw_prompt=[{"role": "user", "content": question}],
        )


class ReferenceServerManager(LLMServerManager):
    """verl's manager of server replicas, over replicas verl did not launch (so no replica
    class: verl's extension point for recipes)."""

    rollout_replica_class = None

    def add_reference_servers(self, servers: dict[str, Any]) -> None:
        """Hold ``servers`` (address: Ray actor) as verl's manager holds the replicas it
        launched, and route to them through verl's load balancer."""
        self.server_addresses = list(servers)
        self.server_handles = list(servers.values())
        ray.get(self.global_load_balancer.add_servers.remote(servers), timeout=60)


def char_tokenizer() -> Any:
    """A Hugging Face tokenizer with the reference model's vocabulary: one token per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({c: i for i, c in enumerate(VOCAB)}, unk_token="?"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="\n", pad_token="\n", unk_token="?"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return tokenizer


def run(args: argparse.Namespace) -> aprof.Manifest:
    """The synchronous trainer: servers, profiler, verl's manager and client, the steps."""
    out = args.out.resolve()
    steps = [int(s) for s in args.steps.split(",") if s]
    cfg = verl_config(out, steps, args.workers)
    plan = aprof.verl.load(cfg)
    for line in plan.warnings:
        say(f"aprof: {line}")
    # The plan's first overrides turn aprof on inside verl's main_ppo (its hook and its
    # block); this trainer loop is the example's own: it takes verl's profiler off alone.
    profiler_off = [o for o in plan.overrides if not o.startswith("++")]
    say(f"verl overrides: {' '.join(profiler_off)} (verl's own profiler stays off)")
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(profiler_off))
    config = aprof.load_config(plan.config.model_dump(mode="json") | {"log": {"level": "warning"}})
    aprof.configure_logging(config.log.format, config.log.level)
    with contextlib.ExitStack() as stack:
        # The servers run in an event loop of their own, as verl's run in their own actors.
        portal = stack.enter_context(start_blocking_portal())
        specs = [
            launch_spec("reference", config, version=REFERENCE_VERSION, port=free_port())
            for _ in range(REPLICAS)
        ]
        say(f"launching {REPLICAS} reference servers (logs in {out / 'logs'})")
        for r, spec in enumerate(specs):
            server = portal.call(
                lambda s=spec, r=r: launch(s, log_path=out / "logs" / f"replica_{r}.log")
            )
            stack.callback(portal.call, server.aclose)
        prof = stack.enter_context(aprof.BlockingProfiler(config))
        for r, spec in enumerate(specs):
            prof.add_target(spec.adapter(replica=r))
        handle = aprof.ray.share(prof)

        manager = ReferenceServerManager.create_empty(config=cfg)  # verl's asyncio.run
        replica = ray.remote(ReferenceReplica).options(num_cpus=0)
        manager.add_reference_servers({s.base_url: replica.remote(s.base_url) for s in specs})
        client = manager.get_client(
            client_cls=aprof.verl.ProfiledLLMServerClient,
            profiler=handle,
            replicas=manager.get_addresses(),
        )
        worker = ray.remote(AgentLoopWorker).options(num_cpus=0)
        workers = [worker.remote(cfg, client) for _ in range(args.workers)]
        say(f"{args.workers} agent-loop workers; profiling steps {args.steps} of {args.num_steps}")
        for n in range(1, args.num_steps + 1):
            began = time.monotonic()
            with prof.step(n):
                failed = ray.get([w.generate_sequences.remote(n, args.samples) for w in workers])
            windows = [f"{w.target} {w.state}" for w in prof.manifest.windows if w.step == n]
            say(
                f"step {n}: {args.workers * args.samples} agent loops, {sum(failed)} failed, "
                f"{time.monotonic() - began:.1f}s; {', '.join(windows) or 'not profiled'}"
            )
    return prof.manifest


def print_table(manifest: aprof.Manifest, out: Path) -> None:
    header = ("step", "target", "state", "stop", "admitted/gated", "files")
    rows = [header]
    for w in manifest.windows:
        rows.append(
            (
                str(w.step),
                w.target,
                w.state,
                w.stop_reason or "-",
                f"{w.requests.admitted}/{w.requests.gated}",
                str(len(w.files)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(f"\nmanifest: {out / 'manifest.json'}")
    for timeline in manifest.timeline:
        print(f"timeline: {out / timeline.path} ({timeline.process} on {timeline.host})")
    for note in manifest.notes:
        print(f"note (step {note.step}, {note.target or 'run'}): {note.text}")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("aprof-verl-agents"), help="save_path")
    parser.add_argument("--steps", default="1,3", help="profiled steps (default 1,3)")
    parser.add_argument("--num-steps", type=int, default=4, help="steps to run (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="agent-loop workers (default 2)")
    parser.add_argument("--samples", type=int, default=32, help="agent loops per worker and step")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster needs no token
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        manifest = run(args)
    finally:
        ray.shutdown()
    print_table(manifest, args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
