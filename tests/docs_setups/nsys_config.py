"""Stand-ins for docs/tools.md's nsys launch helpers: the workers' config, nsys's defaults."""

import aprof

config = aprof.load_config({"global_profiler": {"tool": "nsys", "save_path": "outputs/profile"}})
