"""A tiny causal transformer over a printable-character vocabulary, built from a seed.

Each sequence keeps a key/value cache, so an iteration feeds a new sequence its whole prompt
(prefill) and a running one only its last token (decode), all in one batched forward.
Only the engine imports this module (lazily): ``import servers.reference`` does not import
torch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from servers.reference.tokenizer import MAX_MODEL_LEN, VOCAB


class KVCache:
    """The keys and values of one sequence, in a buffer sized for the longest sequence."""

    def __init__(self, layers: int, heads: int, head_dim: int) -> None:
        self.buffer = torch.zeros((layers, 2, heads, MAX_MODEL_LEN, head_dim))
        """(layer, key or value, head, position, head_dim)."""
        self.length = 0
        """Positions filled."""


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x``: (batch, new, width); past: (batch, heads, cached, head_dim); mask: which
        of cached + new keys each new position may attend to. Returns x and the new k, v."""
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        attended = functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        result: torch.Tensor = x + self.mlp(self.norm2(x))
        return result, k, v


class TinyLM(nn.Module):
    """Two transformer blocks, width 64; greedy next-token prediction for a batch."""

    def __init__(self, seed: int, width: int = 64, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(len(VOCAB), width)
            self.position = nn.Embedding(MAX_MODEL_LEN, width)
            self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, len(VOCAB))
        self.heads = heads
        self.head_dim = width // heads
        self.eval()

    @torch.inference_mode()
    def step(self, batch: list[tuple[list[int], KVCache | None]]) -> list[tuple[int, KVCache]]:
        """One batched forward: for each (new tokens, cache or None) the greedy next token and
        the cache, which now covers the new tokens too."""
        caches = [
            cache or KVCache(len(self.blocks), self.heads, self.head_dim) for _, cache in batch
        ]
        new_lens = [len(tokens) for tokens, _ in batch]
        cached = [cache.length for cache in caches]
        size, new_max, cached_max = len(batch), max(new_lens), max(cached)
        ids = torch.zeros((size, new_max), dtype=torch.long)
        for row, (tokens, _) in enumerate(batch):
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        positions = (torch.tensor(cached).unsqueeze(1) + torch.arange(new_max)).clamp(
            max=MAX_MODEL_LEN - 1
        )
        x = self.embed(ids) + self.position(positions)
        mask = self._mask(new_lens, cached, new_max, cached_max)
        past = torch.stack([cache.buffer[:, :, :, :cached_max] for cache in caches])
        fresh = []
        for index, block in enumerate(self.blocks):
            x, k, v = block(x, past[:, index, 0], past[:, index, 1], mask)
            fresh.append(torch.stack([k, v], dim=1))
        new_kv = torch.stack(fresh, dim=1)  # (batch, layer, 2, heads, new_max, head_dim)
        for row, cache in enumerate(caches):
            end = cache.length + new_lens[row]
            cache.buffer[:, :, :, cache.length : end] = new_kv[row, :, :, :, : new_lens[row]]
            cache.length = end
        last = x[torch.arange(size), torch.tensor(new_lens) - 1]
        tokens = self.head(self.norm(last)).argmax(dim=-1)
        return [(int(token), cache) for token, cache in zip(tokens, caches, strict=True)]

    @staticmethod
    def _mask(
        new_lens: list[int], cached: list[int], new_max: int, cached_max: int
    ) -> torch.Tensor:
        """(batch, 1, new_max, cached_max + new_max): a new position sees its sequence's
        cached keys and the new keys up to itself (padding rows see at least one key)."""
        key = torch.arange(cached_max + new_max)
        query = torch.arange(new_max).unsqueeze(1)
        old = key < torch.tensor(cached).view(-1, 1, 1)
        offset = key - cached_max
        new = (offset >= 0) & (offset <= query) & (offset < torch.tensor(new_lens).view(-1, 1, 1))
        return (old | new).unsqueeze(1)
