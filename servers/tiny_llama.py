"""A tiny random-weight Llama with a byte-level BPE tokenizer, built locally for real vLLM runs.

Nothing is downloaded: the weights are seeded random numbers and the tokenizer is trained on a
fixed synthetic corpus, so two builds with the same seed are identical. transformers and
tokenizers are imported inside :func:`build_tiny_llama`: they are installed only where vLLM is.
"""

from __future__ import annotations

from pathlib import Path

VOCAB_SIZE = 1000
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: the config's unk, bos and eos
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
"""Turns as ``<s>role: text</s>``: what chat-prompt datasets (verl's) need of a tokenizer."""
_WORDS = ("hello", "world", "the", "quick", "brown", "fox", "profile", "step", "engine", "batch")


def corpus(lines: int = 2000) -> list[str]:
    """The synthetic training text of the tokenizer: deterministic word sequences."""
    return [
        " ".join(_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(4 + i % 9)) + f" {i}"
        for i in range(lines)
    ]


def build_tiny_llama(path: str | Path, *, seed: int = 0) -> Path:
    """Write the model (safetensors) and its tokenizer (padding with ``<unk>``, with
    :data:`CHAT_TEMPLATE`) into ``path``; return the folder.

    The shapes are the ones vLLM's CPU attention backend accepts (head_dim 32).
    """
    import torch

    # Installed only beside vLLM (mypy runs without them: see pyproject.toml's overrides).
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out
