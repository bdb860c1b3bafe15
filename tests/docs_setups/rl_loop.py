"""Stand-ins for docs/accounting.md's loop: the reader's config, agent-loop runner, samples and
trainer (a rollout and an update that do nothing)."""

import aprof

cfg = aprof.load_config({"global_profiler": {"steps": [1], "save_path": "outputs/profile"}})
num_steps = 2
samples = [{"prompt": "count to 3"}]


class Runner:
    async def run_batch(self, samples: list[dict[str, str]]) -> list[str]:
        return [sample["prompt"] for sample in samples]


class Trainer:
    async def update(self, batch: list[str]) -> None:
        pass


runner, trainer = Runner(), Trainer()
