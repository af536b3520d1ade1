"""scripts/random_hf_folder.py loaded by its path: the one builder of what the Llama-family tests
read without downloading anything, random-weight folders (make_folder) and tokenizers in each
family's shape (shaped_tokenizer)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "random_hf_folder.py"


def random_hf_folder():
    """A fresh copy of the script's module each call, so that a test may patch it for itself."""
    spec = importlib.util.spec_from_file_location("random_hf_folder", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
