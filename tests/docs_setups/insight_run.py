"""Stand-ins for docs/insight.md's Python: the run its first block made, as ``save_path``."""

from pathlib import Path

import aprof

save_path = Path("outputs/profile")
aprof.load_manifest(save_path)  # made earlier on the page: fail here, not in the block, if not
