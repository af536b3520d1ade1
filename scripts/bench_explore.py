"""`minigpt explore` on GPT-2 small's shape: how long the server takes to trace a 64-token prompt and
how long the page takes to draw it, on this machine.

    python scripts/bench_explore.py [--out DIR] [--tokens 64] [--repeat 5] [--json-out FILE]

Writes (once, into DIR, default runs/gpt2-shaped; about 500 MB) a run of GPT-2 small's shape with
random weights: 12 blocks, 12 heads, width 768, FFN 3,072, a 1,024-row position table, GPT-2's
tanh GELU, a tied head of 50,257 rows; its tokenizer is a byte-level BPE fitted to the shipped corpus
(the rows past the ids it writes are padding, as in a nanoGPT import, and never drawn). Then:
  - the server's side, in this process: explorer.Explorer.trace (Run.trace, the page's views, the
    JSON the page receives), the median of --repeat runs;
  - the page's side, in headless Chromium against `minigpt explore` on the run: the time from
    sending /api/trace to the parsed answer, and the page's render (performance.now() around it),
    the median of --repeat traces of the same prompt at different positions.
Needs selenium and Debian's chromium and chromium-driver (as the browser tests do). Nothing here
belongs in the test suite; tests/test_explore.py builds the same shape smaller with
`write_gpt2_shaped_run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from minigpt.config import load_config  # noqa: E402
from minigpt.model.gpt import MiniGPT  # noqa: E402
from minigpt.runs.checkpoints import model_payload  # noqa: E402
from minigpt.runs.folder import write_run_files  # noqa: E402
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer  # noqa: E402

CORPUS = ROOT / "data" / "tinyshakespeare.txt"
GPT2_SMALL = dict(n_layer=12, n_head=12, n_embd=768, ffn_hidden=3072, context=1024, vocab_size=50257)


def write_gpt2_shaped_run(
    folder: Path,
    *,
    n_layer: int,
    n_head: int,
    n_embd: int,
    ffn_hidden: int,
    context: int,
    vocab_size: int,
    seed: int = 0,
    corpus_chars: int | None = None,
) -> Path:
    """A run folder holding a model of GPT-2's kind (pre-norm LayerNorm, tanh GELU, biases, a tied
    head) of the given shape, with random weights spread enough that attention is not uniform."""
    text = CORPUS.read_text(encoding="utf-8")[:corpus_chars]
    tokenizer = TextTokenizer(train_tokenizer("bpe", vocab_size, text))
    cfg = load_config(
        None,
        [
            f"model.n_layer={n_layer}",
            f"model.n_head={n_head}",
            f"model.n_embd={n_embd}",
            f"model.ffn_hidden={ffn_hidden}",
            f"model.context={context}",
            'model.activation="gelu_tanh"',
            "model.tie_embeddings=true",
            'tokenizer.kind="bpe"',
            f"tokenizer.vocab_size={vocab_size}",
        ],
    )
    # A portable folder, as the teaching runs are: nothing to train from, the folder is the run.
    cfg = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, out=".", data=""),
        source="scripts/bench_explore.py: GPT-2's shape, random weights",
    )
    torch.manual_seed(seed)
    model = MiniGPT(cfg.model, vocab_size=vocab_size).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # gains near 1, small biases
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
            elif "table" in name:  # the tied head reads the token table: logits of a few units
                p.copy_(2.0 * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            else:  # [out, in]: a spread of 1.5 / sqrt(in) makes scores of a few units, peaked attention
                p.copy_(1.5 * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_run_files(folder, cfg, tokenizer, model_payload(cfg, model, tokenizer.vocab_size))
    return folder


def prompt_of(run_dir: Path, tokens: int) -> list[int]:
    from minigpt.api import load

    run = load(run_dir)
    ids = run.tokenizer.encode(CORPUS.read_text(encoding="utf-8")[:4000])
    return ids[:tokens]


def server_side(run_dir: Path, ids: list[int], repeat: int) -> dict[str, float]:
    """Explorer.trace as the server answers the page: the trace, the views, the JSON text."""
    from minigpt.api import load
    from minigpt.explore.explorer import Explorer

    explorer = Explorer(load(run_dir))
    times, sizes = [], []
    for i in range(repeat + 1):  # the first warms the caches and the allocator
        start = time.perf_counter()
        text = json.dumps(explorer.trace({"ids": ids, "position": len(ids) - 1 - i, "views": True}))
        if i:
            times.append(time.perf_counter() - start)
            sizes.append(len(text))
    return {"trace_s": statistics.median(times), "trace_min_s": min(times), "json_bytes": sizes[0]}


def page_side(run_dir: Path, ids: list[int], repeat: int) -> dict[str, float]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    server = subprocess.Popen(
        [sys.executable, "-m", "minigpt", "explore", "--run", str(run_dir), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().strip()
        options = webdriver.ChromeOptions()
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
            options.add_argument(argument)
        options.add_argument("--window-size=1280,800")
        options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
        page = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
        try:
            page.get(url)
            wait = WebDriverWait(page, 300)
            wait.until(lambda p: p.execute_script("return document.body.dataset.state") == "ready")
            fetched, drawn, server_ms = [], [], []
            for i in range(repeat + 1):
                position = len(ids) - 1 - i
                page.execute_script(
                    "S.source = {ids: arguments[0]}; S.position = arguments[1]; trace();", ids, position
                )
                wait.until(
                    lambda p, position=position: p.execute_script(
                        "const r = document.body.dataset.request; return document.body.dataset.state === 'ready' && "
                        "r && JSON.parse(r).position === arguments[0]",
                        position,
                    )
                )
                if i:
                    data = page.execute_script("return document.body.dataset")
                    fetched.append(float(data["fetchMs"]) / 1000)
                    drawn.append(float(data["renderMs"]) / 1000)
                    server_ms.append(float(data["serverMs"]) / 1000)
            return {
                "request_to_answer_s": statistics.median(fetched),
                "server_compute_s": statistics.median(server_ms),
                "render_s": statistics.median(drawn),
                "render_max_s": max(drawn),
            }
        finally:
            page.quit()
    finally:
        server.terminate()
        server.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpt2-shaped")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not (args.out / "checkpoint.pt").exists():
        start = time.perf_counter()
        write_gpt2_shaped_run(args.out, **GPT2_SMALL)
        print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    ids = prompt_of(args.out, args.tokens)
    report = {
        "shape": GPT2_SMALL,
        "prompt_tokens": len(ids),
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "torch": torch.__version__},
        "server": server_side(args.out, ids, args.repeat),
        "page": page_side(args.out, ids, args.repeat),
    }
    report["machine"]["load_average_after"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
