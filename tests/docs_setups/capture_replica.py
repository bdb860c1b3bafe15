"""Stand-ins for docs/on-demand.md's Python: the reader's config and a rollout replica's target."""

import aprof
from aprof.testing import RecordingTarget

cfg = aprof.load_config({"global_profiler": {"steps": [1], "save_path": "outputs/python"}})
replica = RecordingTarget("replica_0", replica=0)
