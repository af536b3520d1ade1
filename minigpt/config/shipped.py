"""Where the shipped configs/ and data/ are, so a config file and its default corpus are found
whatever directory a command runs in."""

from __future__ import annotations

import sysconfig
from pathlib import Path


def _shipped_root() -> Path:
    """Where configs/ and data/ are: the checkout (an editable install, or running from source), else
    the copy a regular `pip install .` puts under <prefix>/share/minigpt (pyproject's data-files)."""
    checkout = Path(__file__).resolve().parents[2]  # minigpt/config/shipped.py -> the checkout
    installed = Path(sysconfig.get_path("data")) / "share" / "minigpt"
    if not (checkout / "configs" / "default.toml").is_file() and (installed / "configs" / "default.toml").is_file():
        return installed
    return checkout


PROJECT_ROOT = _shipped_root()
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.toml"
DEFAULT_CORPUS = PROJECT_ROOT / "data" / "tinyshakespeare.txt"
