"""Where selfspec keeps what it measured or built once per machine (cost curves, the compiled kernel)."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "SELFSPEC_CACHE_DIR"


def cache_dir() -> Path:
    """$SELFSPEC_CACHE_DIR, else $XDG_CACHE_HOME/selfspec, else ~/.cache/selfspec."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "selfspec"
