"""Make the index's torchvision importable on CPU torch (run by ``nox -s e2e_sglang``).

torchvision 0.28.0 (the release for torch 2.13) is built against CUDA torch: its ``_C``
extension does not load on the CPU build, and ``torchvision/_meta_registrations.py`` then
registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms`` unguarded, which
raises ``RuntimeError: operator torchvision::nms does not exist`` at ``import torchvision``.
SGLang imports ``torchvision.transforms`` unconditionally, so this guards those two
registrations the way the file already guards its others (``extension._has_ops()``).
Idempotent; exits non-zero if ``import torchvision.transforms`` still fails.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

GUARD = """

def _register_fake_if_ops(name):  # added by aprof's e2e_sglang session
    def wrapper(fn):
        if torchvision.extension._has_ops():
            return torch.library.register_fake(name)(fn)
        return fn

    return wrapper
"""
MARK = "_register_fake_if_ops"


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("torchvision is not installed", file=sys.stderr)
        return 1
    path = Path(spec.origin).with_name("_meta_registrations.py")
    text = path.read_text()
    if MARK not in text:
        anchor = "\n\ndef register_meta("
        if anchor not in text or "@torch.library.register_fake(" not in text:
            print(f"{path}: unexpected layout, not patched", file=sys.stderr)
            return 1
        text = text.replace(anchor, GUARD + anchor, 1)
        text = text.replace("@torch.library.register_fake(", f"@{MARK}(")
        path.write_text(text)
        print(f"guarded the fake-kernel registrations in {path}")
    check = [sys.executable, "-c", "import torchvision.transforms"]
    return subprocess.run(check, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
