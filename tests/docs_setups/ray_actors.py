"""Stand-ins for docs/workers.md's Ray example: a local Ray (127.0.0.1 only), the workers'
config (the actor role), a step count and a batch."""

import os

import ray

import aprof

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster needs no token
ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
cfg = aprof.load_config(
    {
        "global_profiler": {"steps": [1], "save_path": "outputs/ray", "tool": "torch"},
        "roles": {"actor": {}},  # rank 0 captures
    }
)
num_steps = 2
batch = {"input_ids": [[1, 2, 3]]}
