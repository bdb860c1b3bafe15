"""The ``search`` tool: term-overlap search over a small in-memory corpus, behind a delay that
stands in for the round trip to a real search service."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping

from agentloop._tools import Tool

CORPUS: Mapping[str, str] = {
    "asyncio": "asyncio runs many coroutines on one thread; an await hands control back.",
    "continuous batching": "A server adds and removes sequences between forward passes.",
    "prefix cache": "Turns of one conversation reuse the cached keys of their shared prefix.",
    "vllm": "vLLM serves models over an OpenAI-compatible HTTP API with paged attention.",
    "sglang": "SGLang serves models with a radix-tree prefix cache and a /generate route.",
    "rl step": "One RL step rolls out prompts, scores them and updates the policy weights.",
    "staleness": "Off-policy rollouts are stale: produced by weights some steps behind.",
    "profiler": "A profiler records what ran, when and for how long, for chosen windows.",
}
"""The default corpus: title -> text."""

MAX_DELAY_S = 10.0
"""Longest delay a search may be given."""

_WORD = re.compile(r"[a-z0-9]+")


def make_search(
    corpus: Mapping[str, str] = CORPUS, *, delay_s: float = 0.01, top_k: int = 1
) -> Tool:
    """A ``search`` tool over ``corpus`` (title -> text) answering after ``delay_s`` seconds.

    Its argument is ``query``; it answers with the ``top_k`` entries sharing the most words
    with the query, one ``title: text`` line each, or ``no results``.
    """
    if not 0 <= delay_s <= MAX_DELAY_S:
        raise ValueError(f"delay_s must be between 0 and {MAX_DELAY_S}, got {delay_s!r}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    index = {title: set(_WORD.findall(f"{title} {text}".lower())) for title, text in corpus.items()}
    frequency: dict[str, int] = {}
    for words in index.values():
        for word in words:
            frequency[word] = frequency.get(word, 0) + 1

    async def search(query: str) -> str:
        """Search the corpus; answers with the best matching entries."""
        await asyncio.sleep(delay_s)  # the service's round trip
        wanted = set(_WORD.findall(query.lower()))
        # Rarer words weigh more (inverse document frequency), so "the" does not decide.
        scored = [
            (sum(math.log(1 + len(index) / frequency[w]) for w in wanted & words), title)
            for title, words in index.items()
        ]
        best = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))[:top_k]
        if not best:
            return "no results"
        return "\n".join(f"{title}: {corpus[title]}" for _, title in best)

    return Tool(
        name="search",
        fn=search,
        description="Search a small knowledge base; the argument is the query text.",
    )


search = make_search()
"""The search tool over :data:`CORPUS`, with a 10 ms delay."""
