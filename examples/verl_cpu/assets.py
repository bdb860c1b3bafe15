"""What a verl run of ``examples/verl_ppo.py`` trains on, made on the spot (nothing is
downloaded): ``python assets.py DIR`` writes ``DIR/model`` (the project's tiny random Llama,
``servers.tiny_llama``), ``DIR/data/{train,val}.parquet`` (64 and 8 chat prompts in verl's RL
dataset layout) and ``DIR/reward.py`` (verl's custom reward function).
"""

from __future__ import annotations

import sys
from pathlib import Path

from servers.tiny_llama import build_tiny_llama

WORDS = ("alpha", "beta", "gamma", "delta", "kernel", "trace", "window", "replica", "rank", "step")
REWARD = '''\
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1 when the answer holds the prompt's first word, else a share of its length."""
    return 1.0 if ground_truth in solution_str else min(len(solution_str), 40) / 80.0
'''


def make_data(folder: Path) -> None:
    import pandas as pd

    rows = []
    for i in range(64):
        words = " ".join(WORDS[(i * 5 + k * 3) % len(WORDS)] for k in range(3 + i % 4))
        rows.append(
            {
                "data_source": "echo",
                "prompt": [{"role": "user", "content": f"say: {words}"}],
                "ability": "echo",
                "reward_model": {"style": "rule", "ground_truth": words.split()[0]},
                "extra_info": {"index": i, "split": "train"},
            }
        )
    folder.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    frame.to_parquet(folder / "train.parquet")
    frame.iloc[:8].to_parquet(folder / "val.parquet")


def make(root: Path) -> None:
    """The model, the data and the reward function under ``root``, each made once."""
    if not (root / "model" / "tokenizer_config.json").is_file():
        build_tiny_llama(root / "model")
    if not (root / "data" / "val.parquet").is_file():
        make_data(root / "data")
    (root / "reward.py").write_text(REWARD)


if __name__ == "__main__":
    make(Path(sys.argv[1]).resolve())
