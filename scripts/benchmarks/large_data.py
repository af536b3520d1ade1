"""A 100 MB text and a folder of 1,000 files (`--only folder`), made from the shipped corpus and
deleted afterwards: preparing them with the token cache empty and then warm, time and peak memory."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import ROOT
from .processes import timed_process

LARGE_TEXT_CHILD = r"""
import json, resource, sys, time
t0 = time.time()
from minigpt.config import load_config
from minigpt.text.corpus import load_corpus
from minigpt.training.session import build
from minigpt.training.trainer import Trainer
cfg = load_config(None, ["train.data=" + json.dumps(sys.argv[1]), "train.batch_size=64"])
imported = time.time()
corpus = load_corpus(cfg)
prepared = time.time()
trainer = Trainer(build(cfg, corpus, "cpu"))
trainer.train_step()
stepped = time.time()
print(json.dumps({"start": t0, "imported": imported, "prepared": prepared, "first_step": stepped,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "train_tokens": len(corpus.train_ids)}))
"""


def large_text(megabytes: int, env: dict) -> dict:
    """A text of `megabytes` MB (the shipped corpus repeated), first run with an empty cache, then a
    second with the cache: time to prepare, peak memory, time to the first training step."""
    corpus = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-") as scratch:
        big = Path(scratch) / "big.txt"
        with open(big, "w", encoding="utf-8") as f:
            for _ in range(math.ceil(megabytes * 1_000_000 / len(corpus))):
                f.write(corpus)
        child_env = {**env, "MINIGPT_CACHE": str(Path(scratch) / "cache")}
        runs = []
        for _ in range(2):
            launched = time.time()
            done = subprocess.run(
                [sys.executable, "-c", LARGE_TEXT_CHILD, str(big)],
                capture_output=True,
                text=True,
                env=child_env,
                cwd=ROOT,
            )
            if done.returncode != 0:
                raise SystemExit(f"bench: large-text run failed:\n{done.stderr}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append(
                {
                    "prepare_s": round(r["prepared"] - r["imported"], 2),
                    "first_step_after_launch_s": round(r["first_step"] - launched, 2),
                    "first_step_after_imports_s": round(r["first_step"] - r["imported"], 2),
                    "peak_rss_mb": round(r["peak_rss_mb"]),
                    "train_tokens": r["train_tokens"],
                }
            )
        return {"megabytes": round(big.stat().st_size / 1e6, 1), "first_run": runs[0], "cached_run": runs[1]}


def write_folder(folder: Path, files: int, megabytes: float) -> int:
    """`files` text files totalling about `megabytes` MB in ten subfolders, each a different stretch
    of the shipped corpus (so no two are the same file); returns the bytes written."""
    corpus = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    size = round(megabytes * 1_000_000 / files)
    wrapped = corpus * (size // len(corpus) + 2)
    total = 0
    for i in range(files):
        start = i * 7919 % len(corpus)
        path = folder / f"part{i % 10}" / f"{i:04d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        total += path.write_bytes(wrapped[start : start + size].encode("utf-8"))
    return total


def folder_benchmark(files: int, megabytes: float, config: str | None, env: dict) -> dict:
    """`minigpt train --data FOLDER --steps 1` on a folder of `files` files totalling `megabytes` MB,
    as a user runs it: first with an empty token cache (every file read, the tokenizer fitted to
    every head, every file encoded and the splits joined), then again with the cache warm. Wall time
    and peak resident memory of each."""
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-folder-") as scratch:
        folder = Path(scratch) / "corpus"
        written = write_folder(folder, files, megabytes)
        child_env = {**env, "MINIGPT_CACHE": str(Path(scratch) / "cache")}
        command = [sys.executable, "-m", "minigpt", "train", "--data", str(folder), "--steps", "1"]
        command += ["--out", str(Path(scratch) / "run"), "--force"] + (["-c", config] if config else [])
        runs = []
        for _ in range(2):
            r = timed_process(command, child_env, ROOT)
            found = re.search(r"([\d,]+) train / ([\d,]+) val tokens", r.pop("stderr"))
            if found:
                r |= {"train_tokens": int(found[1].replace(",", "")), "val_tokens": int(found[2].replace(",", ""))}
            runs.append(r)
    return {
        "files": files,
        "megabytes": round(written / 1e6, 1),
        "command": "minigpt train --data FOLDER --steps 1" + (f" -c {config}" if config else ""),
        "first_run": runs[0],
        "cached_run": runs[1],
    }


def print_folder(f: dict) -> None:
    a, b = f["first_run"], f["cached_run"]
    print(
        f"folder of {f['files']:,} files, {f['megabytes']} MB ({f['command']}): first run {a['wall_s']} s, "
        f"peak {a['peak_rss_mb']} MB; with the cache {b['wall_s']} s, peak {b['peak_rss_mb']} MB"
    )
