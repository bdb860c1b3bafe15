"""verl's agent-loop manager with aprof: its workers' client profiles each call to a replica.

Named in verl's config (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``), it is
made by ``RayPPOTrainer.init_workers()``; with ``aprof.verl.ProfiledTrainerMixin`` on the
trainer, it hands its agent-loop workers verl's client with ``ProfiledClientMixin``.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopManager

from aprof._logging import logger
from aprof.verl._client import profiled
from aprof.verl._trainer import SHARING

CONFIG_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
"""Where verl's config names the agent-loop manager class."""


class ProfiledAgentLoopManager(AgentLoopManager):  # type: ignore[misc]
    """verl's ``AgentLoopManager`` whose workers' requests gate and count through aprof:
    ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=aprof.verl.ProfiledAgentLoopManager``.
    """

    def __init__(self, config: Any, llm_client: Any, *args: Any, **kwargs: Any) -> None:
        sharing = SHARING.get()
        if sharing is None:
            logger.warning(
                "aprof: agent loops not profiled: run the trainer with "
                "aprof.verl.ProfiledTrainerMixin and aprof_profiler set before init_workers()"
            )
        else:
            llm_client = profiled(llm_client, profiler=sharing.handle, replicas=sharing.replicas())
        super().__init__(config, llm_client, *args, **kwargs)
