"""``/metrics`` in Prometheus text format, with the forward-step counter under each dialect's name.

vLLM: the histogram ``vllm:iteration_tokens_total`` gets one observation per engine
iteration (its ``_count`` is the forward-step counter, as on the real server). SGLang
(0.5.23, observed) names no counter for forward steps, but
``sglang:cuda_graph_passes_total{mode=...}`` counts every forward pass by mode
(``prefill_none``, ``decode_none``: no CUDA graph), also with CUDA graphs off; its sum over
modes is the forward-step counter.
"""

from __future__ import annotations

from servers.reference.engine import Engine, Sequence, StepInfo

_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Metrics:
    """Counters fed by the engine's listeners, rendered on request."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._bucket_counts = [0] * len(_BUCKETS)
        self.iterations = 0
        self.iteration_tokens = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished_requests = 0
        self.passes = {"prefill_none": 0, "decode_none": 0}
        """SGLang's forward passes by mode (a mixed batch is an extend)."""
        engine.step_listeners.append(self._on_step)
        engine.finish_listeners.append(self._on_finish)

    def _on_step(self, info: StepInfo) -> None:
        self.iterations += 1
        self.passes["decode_none" if info.kind == "decode" else "prefill_none"] += 1
        self.iteration_tokens += info.tokens
        self.prompt_tokens += info.prefill_tokens
        self.generation_tokens += info.prefill_seqs + info.decode_seqs
        for index, bound in enumerate(_BUCKETS):
            if info.tokens <= bound:
                self._bucket_counts[index] += 1

    def _on_finish(self, seq: Sequence) -> None:
        if seq.finished:
            self.finished_requests += 1

    def render(self, dialect: str, model_name: str) -> str:
        """The exposition text of ``dialect`` (``vllm`` or ``sglang``)."""
        if dialect == "vllm":
            return self._vllm(f'engine="0",model_name="{model_name}"')
        return self._sglang(f'model_name="{model_name}"')

    def _vllm(self, labels: str) -> str:
        name = "vllm:iteration_tokens_total"
        lines = [
            f"# HELP {name} Histogram of number of tokens per engine_step.",
            f"# TYPE {name} histogram",
        ]
        for bound, count in zip(_BUCKETS, self._bucket_counts, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(count)}')
        lines += [
            f'{name}_bucket{{{labels},le="+Inf"}} {float(self.iterations)}',
            f"{name}_count{{{labels}}} {float(self.iterations)}",
            f"{name}_sum{{{labels}}} {float(self.iteration_tokens)}",
        ]
        lines += _gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            self._engine.num_running,
        )
        lines += _gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            self._engine.num_waiting,
        )
        lines += _counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, self.prompt_tokens
        )
        lines += _counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            self.generation_tokens,
        )
        lines += _counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels,
            self.finished_requests,
        )
        return "\n".join(lines) + "\n"

    def _sglang(self, labels: str) -> str:
        name = "sglang:cuda_graph_passes_total"
        lines = [
            f"# HELP {name} Forward passes by mode (CUDA graph or not).",
            f"# TYPE {name} counter",
        ]
        for mode, count in self.passes.items():
            lines.append(f'{name}{{{labels},mode="{mode}"}} {float(count)}')
        lines += _gauge(
            "sglang:num_running_reqs",
            "The number of running requests.",
            labels,
            self._engine.num_running,
        )
        lines += _gauge(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            labels,
            self._engine.num_waiting,
        )
        lines += _counter(
            "sglang:prompt_tokens",
            "Number of prefill tokens processed.",
            labels,
            self.prompt_tokens,
        )
        lines += _counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            self.generation_tokens,
        )
        return "\n".join(lines) + "\n"


def _gauge(name: str, text: str, labels: str, value: int) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)}"]


def _counter(name: str, text: str, labels: str, value: int) -> list[str]:
    return [
        f"# HELP {name} {text}",
        f"# TYPE {name} counter",
        f"{name}_total{{{labels}}} {float(value)}",
    ]
