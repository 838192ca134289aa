"""Inductor's default cache directory, worked out without importing torch.

tests/conftest.py sets TORCHINDUCTOR_CACHE_DIR to it before any test runs (why: see there), in
every pytest process, the xdist controller's too, which never needs torch: importing
`torch._inductor.runtime.cache_dir_utils` for it costs each of them torch and inductor's import,
3 CPU-seconds. The rule is torch's (`default_cache_dir` in that module, open-source builds);
tests/unit/test_served.py checks that the two agree.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile


def default_cache_dir() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    sanitized = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + sanitized)
