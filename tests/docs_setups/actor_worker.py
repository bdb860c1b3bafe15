"""Stand-ins for docs/workers.md's first example: the workers' config (the page's
Configuration section), its step count and a batch."""

import aprof

config = aprof.load_config(
    """
global_profiler: {steps: [1, 2], save_path: outputs/profile, tool: torch, continuous: false}
roles:
  actor: {ranks: [0], discrete: false}
  ref: {all_ranks: true, discrete: true}
"""
)
num_steps = 2
batch = {"input_ids": [[1, 2, 3]]}
