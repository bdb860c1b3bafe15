"""aprof's switch inside verl's ``main_ppo``: Ray's worker setup hook.

``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=aprof.verl.hook.install`` makes
every Ray worker of a verl run call :func:`install` as it starts. Nothing of verl is imported
here: :func:`install` asks to be told when verl's trainer modules are first imported, and then

- wraps ``verl.trainer.ppo.v1.get_trainer_cls`` (the V1 trainer of every ``trainer_mode``) so
  the class it returns has aprof's V1 mixin first (``aprof.verl._v1``);
- rebinds ``verl.trainer.ppo.ray_trainer.RayPPOTrainer`` (the legacy trainer) to one with
  aprof's legacy mixin first (``aprof.verl._legacy``): the TaskRunner that Ray sends to its
  actor finds the trainer class there by name;
- lets verl's vLLM server actor take the W3C trace context of aprof's requests and hand it to
  the engine (``aprof.verl._trace_context``).

Both are inert unless verl's config holds an ``aprof`` block (aprof's configuration): a run
without one is verl's own. Where aprof's own code cannot load, the trainer stays verl's and the
reason is logged: the observer never stops the run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from aprof._errors import describe
from aprof._logging import logger
from aprof.verl._trace_context import carry

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}
"""What to do with each module once its own code has run, by module name."""


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules :data:`_PENDING` names as the path finder does, and runs their
    pending calls right after the module's own code."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PENDING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader: Any = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            for call in _PENDING.pop(fullname, ()):
                _apply(call, module)

        loader.exec_module = exec_module  # this spec's own loader, made by find_spec
        return spec


_FINDER = _AfterImport()


def after_import(name: str, call: Callable[[ModuleType], None]) -> None:
    """``call(module)`` once module ``name`` is imported: now when it already is, else right
    after its code has run. A call that raises is logged; the import goes on."""
    module = sys.modules.get(name)
    if module is not None:
        _apply(call, module)
        return
    _PENDING.setdefault(name, []).append(call)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _apply(call: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        call(module)
    except Exception as exc:  # the observer never stops the process it observes
        logger.error("aprof verl hook failed", module=module.__name__, error=describe(exc))


def install() -> None:
    """Put aprof's trainer mixins into verl's trainers, as they are imported (Ray's
    ``worker_process_setup_hook``)."""
    after_import("verl.trainer.ppo.v1", _wrap_v1)
    after_import("verl.trainer.ppo.ray_trainer", _wrap_legacy)
    after_import("verl.workers.rollout.vllm_rollout.vllm_async_server", carry)


def _wrap_v1(package: ModuleType) -> None:
    found = package.get_trainer_cls
    if getattr(found, "aprof_wrapped", False):
        return

    def get_trainer_cls(name: str) -> type:
        trainer: type = found(name)
        try:
            from aprof.verl._v1 import with_aprof

            return with_aprof(trainer)
        except Exception as exc:  # verl's trainer runs on, unprofiled
            logger.error("aprof verl trainer not loaded", trainer=name, error=describe(exc))
            return trainer

    get_trainer_cls.aprof_wrapped = True  # type: ignore[attr-defined]
    get_trainer_cls.__doc__ = found.__doc__
    setattr(package, "get_trainer_cls", get_trainer_cls)  # noqa: B010


def _wrap_legacy(module: ModuleType) -> None:
    from aprof.verl._legacy import with_aprof

    setattr(module, "RayPPOTrainer", with_aprof(module.RayPPOTrainer))  # noqa: B010
