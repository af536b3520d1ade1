"""`--only llama` and `--only llama-memory`: an imported Llama-family model (random weights of a
real checkpoint's shape, written by scripts/random_hf_folder.py) against transformers on the same
folder, and the import's peak memory on bfloat16 folders."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from minigpt.config import SampleConfig
from minigpt.sampling.generate import generate

from . import ROOT
from .processes import timed_process

LLAMA_SHAPE = "smollm2-135m"  # scripts/random_hf_folder.py's SmolLM2-135M shape: 30 blocks, 9 heads, 3 kv heads
LLAMA_MEMORY_SHAPES = ("qwen2.5-0.5b", "llama-3.2-1b")  # stored in bfloat16, as the real ones are


def random_hf_folder(out: Path, shape: str, dtype: str, env: dict) -> Path:
    """A random-weight folder of a real checkpoint's shape, written by scripts/random_hf_folder.py
    (transformers itself) in a child process, so that its memory is never this process's."""
    command = [sys.executable, str(ROOT / "scripts" / "random_hf_folder.py"), "--shape", shape, "--dtype", dtype]
    done = subprocess.run([*command, str(out)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench: scripts/random_hf_folder.py --shape {shape} failed:\n{done.stderr[-3000:]}")
    return out


def import_command(folder: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "minigpt", "import", "hf", str(folder), "--out", str(run), "--force"]


def equal_length_prompts(tokenizer, length: int = 20) -> tuple[str, str]:
    """Two texts of `length` tokens each (lines of the shipped corpus) that differ in one word near
    the middle, as `minigpt patch` takes them."""
    words = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:20_000].split()
    for start in range(0, len(words) - 60, 7):
        for n in range(3, 60):
            clean = words[start : start + n]
            found = len(tokenizer.encode(" ".join(clean)))
            if found > length:
                break
            if found < length:
                continue
            middle = n // 2
            for other in words[:500]:
                corrupt = [*clean[:middle], other, *clean[middle + 1 :]]
                if other != clean[middle] and len(tokenizer.encode(" ".join(corrupt))) == length:
                    return " ".join(clean), " ".join(corrupt)
    raise SystemExit(f"bench: no two texts of {length} tokens found for the patching sweep")


def llama_sampling(run_dir: Path, folder: Path, new_tokens: int, rounds: int, thread_counts: list[int]) -> dict:
    """Greedy sampling at batch 1 from a short prompt: minigpt through its API as `minigpt sample`
    runs it (`minigpt.load(RUN).samples(prompt, max_new_tokens=N, greedy=True)`, tokens/s over the
    result's own seconds: the generation, model load excluded) against transformers' `generate`
    (do_sample=False, use_cache=True, the same prompt ids, no end-of-text stop, float32) on the
    folder the run was imported from, at each thread count (one is what `minigpt sample` uses for
    one sample), rounds alternating between the two, the best round of each. Both compute in
    float32 from the same weights, so the greedy tokens should agree; where they do not, the first
    step that differs is reported. Beside them, minigpt's loop with every step on the model itself
    (`generate(..., fast_path=False)`: no decoding copy, sampling/decoding.py), what that copy adds."""
    import transformers

    import minigpt

    prompt = "ROMEO:"
    runs = {t: minigpt.load(run_dir, set={"train.threads": t}) for t in thread_counts}
    prompt_ids = next(iter(runs.values())).tokenizer.encode(prompt)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # minigpt stops at max_new_tokens (or stop text), never at an id
    hf.generation_config.pad_token_id = 0

    def transformers_generate(threads: int, tokens: int) -> tuple[list[int], float]:
        torch.set_num_threads(threads)
        ids = torch.tensor([prompt_ids])
        started = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=tokens, use_cache=True
            )
        return out[0, len(prompt_ids) :].tolist(), time.perf_counter() - started

    def minigpt_sample(threads: int, tokens: int) -> tuple[list[int], float]:
        result = runs[threads].samples(prompt, max_new_tokens=tokens, greedy=True)[0]
        return result.token_ids, result.seconds

    def minigpt_model_itself(threads: int, tokens: int) -> tuple[list[int], float]:
        # the same loop with fast_path=False: every step on the model itself, no decoding copy
        torch.set_num_threads(threads)
        steps = generate(
            runs[threads].model, prompt_ids, SampleConfig(max_new_tokens=tokens, greedy=True), fast_path=False
        )
        started = time.perf_counter()
        ids = torch.cat([step.tokens for step in steps]).tolist()
        return ids, time.perf_counter() - started

    def minigpt_bfloat16(threads: int, tokens: int) -> tuple[list[int], float]:
        # [sample] precision = "bfloat16": the cached steps on a bfloat16 copy (other numbers)
        result = runs[threads].samples(prompt, max_new_tokens=tokens, greedy=True, precision="bfloat16")[0]
        return result.token_ids, result.seconds

    systems = {"minigpt": minigpt_sample, "minigpt_model_itself": minigpt_model_itself}
    systems["minigpt_bfloat16"] = minigpt_bfloat16
    systems["transformers"] = transformers_generate
    for threads in thread_counts:  # kernels and allocator warmed outside the clock
        for measure in systems.values():
            measure(threads, 8)
    best: dict[tuple[str, int], float] = {}
    tokens: dict[tuple[str, int], list[int]] = {}
    for _ in range(rounds):
        for threads in thread_counts:
            for name, measure in systems.items():
                ids, seconds = measure(threads, new_tokens)
                tokens[name, threads] = ids
                best[name, threads] = min(best.get((name, threads), math.inf), seconds)
    torch.set_num_threads(thread_counts[-1])
    out = {"prompt": prompt, "prompt_tokens": len(prompt_ids), "new_tokens": new_tokens}
    for threads in thread_counts:
        mine, theirs = tokens["minigpt", threads], tokens["transformers", threads]
        differs = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if differs is None and len(mine) != len(theirs):
            differs = min(len(mine), len(theirs))
        out[f"threads_{threads}"] = {
            "minigpt_tokens_per_s": round(len(mine) / best["minigpt", threads], 2),
            "minigpt_model_itself_tokens_per_s": round(new_tokens / best["minigpt_model_itself", threads], 2),
            "minigpt_bfloat16_tokens_per_s": round(new_tokens / best["minigpt_bfloat16", threads], 2),
            "minigpt_bfloat16_same_tokens": tokens["minigpt_bfloat16", threads] == theirs,
            "transformers_tokens_per_s": round(len(theirs) / best["transformers", threads], 2),
            "ratio": round(best["transformers", threads] / best["minigpt", threads], 2),
            "same_tokens": differs is None,
            "first_different_step": differs,
        }
    return out


def llama_benchmark(
    env: dict,
    scratch: Path,
    folder: Path | None = None,
    new_tokens: int = 200,
    rounds: int = 3,
    shape: str = LLAMA_SHAPE,
) -> dict:
    """An imported Llama-family model, SmolLM2-135M-shaped with random weights (`folder`, or one
    written here by scripts/random_hf_folder.py): `minigpt import hf FOLDER --out RUN` start to
    exit (and its peak resident memory); greedy sampling against transformers' `generate`
    (llama_sampling); and `minigpt patch --by stage` on two 20-token prompts that differ in one
    word, start to exit, beside the sweep alone through the API (`Run.patch`, model loaded)."""
    import minigpt

    model = f"{shape} shape" if folder is None else f"folder {folder.name}"
    if folder is None:
        folder = random_hf_folder(scratch / f"{shape}-folder", shape, "float32", env)
    run_dir = scratch / f"{shape}-run"
    imported = timed_process(import_command(folder, run_dir), env, scratch)
    out: dict = {
        "model": model,
        "folder": str(folder),
        "import": {"wall_s": imported["wall_s"], "peak_rss_gib": round(imported["peak_rss_mb"] / 1024, 2)},
    }
    print(f"  import hf, {model}: {out['import']}", file=sys.stderr, flush=True)
    threads = torch.get_num_threads()
    out["sampling"] = llama_sampling(run_dir, folder, new_tokens, rounds, sorted({1, threads}))
    print(f"  sampling, {model}: {out['sampling']}", file=sys.stderr, flush=True)
    torch.set_num_threads(threads)
    run = minigpt.load(run_dir)
    clean, corrupt = equal_length_prompts(run.tokenizer)
    answer, versus = "#" + str(run.tokenizer.encode(" the")[-1]), "#" + str(run.tokenizer.encode(" a")[-1])
    command = [sys.executable, "-m", "minigpt", "patch", "--run", str(run_dir), "--clean", clean]
    command += ["--corrupt", corrupt, "--answer", answer, "--versus", versus, "--by", "stage"]
    cli = min(timed_process(command, env, scratch)["wall_s"] for _ in range(2))
    sweep = math.inf
    for _ in range(2):
        started = time.perf_counter()
        run.patch(clean, corrupt, answer, versus, by="stage")
        sweep = min(sweep, time.perf_counter() - started)
    out["patch"] = {
        "tokens": len(run.tokenizer.encode(clean)),
        "command_s": cli,
        "sweep_s": round(sweep, 2),
        "threads": run.cfg.train.threads or threads,
    }
    print(f"  patch --by stage, {model}: {out['patch']}", file=sys.stderr, flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def llama_rows(llama: dict, row) -> None:
    sampling = llama["sampling"]
    for key, figures in sampling.items():
        if not key.startswith("threads_"):
            continue
        threads = key.removeprefix("threads_")
        same = "same tokens" if figures["same_tokens"] else f"tokens differ from step {figures['first_different_step']}"
        row(
            f"sample tokens/s, {llama['model']}, {sampling['new_tokens']} new tokens, greedy, {threads} thread(s); "
            f"{same} (nanoGPT column: transformers' generate)",
            figures["minigpt_tokens_per_s"],
            figures["transformers_tokens_per_s"],
            "tokens/s",
            ">= 1.5x",
        )
        row(
            f"the same, {threads} thread(s), every step on the model itself (fast_path=False: no decoding copy)",
            figures["minigpt_model_itself_tokens_per_s"],
            figures["transformers_tokens_per_s"],
            "tokens/s",
            "",
        )
        if "minigpt_bfloat16_tokens_per_s" in figures:
            agrees = "the same greedy tokens" if figures["minigpt_bfloat16_same_tokens"] else "other greedy tokens"
            row(
                f'the same, {threads} thread(s), [sample] precision = "bfloat16" (not float32\'s numbers: {agrees})',
                figures["minigpt_bfloat16_tokens_per_s"],
                figures["transformers_tokens_per_s"],
                "tokens/s",
                ">= 1.5x",
            )
    row(f"`minigpt import hf`, {llama['model']}, start to exit (s; peak {llama['import']['peak_rss_gib']} GiB)",
        llama["import"]["wall_s"], None, "s", "")  # fmt: skip
    p = llama["patch"]
    row(f"`minigpt patch --by stage`, {p['tokens']}-token prompts, {llama['model']}, start to exit (s)",
        p["command_s"], None, "s", "")  # fmt: skip
    row(f"the same sweep through the API, model loaded ({p['threads']} threads) (s)", p["sweep_s"], None, "s", "")


def safetensors_elements(folder: Path) -> tuple[int, int]:
    """(numbers stored, bytes of the weight files) of a folder's safetensors, from their headers."""
    from safetensors import safe_open

    elements, size = 0, 0
    for path in sorted(folder.glob("*.safetensors")):
        size += path.stat().st_size
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                elements += math.prod(f.get_slice(name).get_shape())
    return elements, size


def llama_memory_benchmark(env: dict, scratch: Path, shapes=LLAMA_MEMORY_SHAPES, build=random_hf_folder) -> dict:
    """`minigpt import hf` of random-weight folders of Qwen2.5-0.5B's and Llama-3.2-1B's shapes,
    stored in bfloat16 as the real ones are (minigpt widens them to float32, exactly): the peak
    resident memory of the import process alone (timed_process), beside the model's float32 size
    and the weight file's size. The issue's bound: no two float32 copies held longer than needed,
    read here as a peak of at most 1.3 x the float32 size plus the file (which the import maps,
    and the kernel counts as resident once read). Each folder and run is deleted once measured
    (the 1B folder is 2.5 GB, its run 5 GB; building it takes about 6 GB and a minute)."""
    out = {}
    for shape in shapes:
        folder, run_dir = scratch / f"{shape}-folder", scratch / f"{shape}-run"
        try:
            build(folder, shape, "bfloat16", env)
            elements, file_bytes = safetensors_elements(folder)
            measured = timed_process(import_command(folder, run_dir), env, scratch)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(run_dir, ignore_errors=True)
        float32 = 4 * elements
        peak = measured["peak_rss_mb"] * 2**20
        out[shape] = {
            "parameters": elements,
            "float32_gib": round(float32 / 2**30, 2),
            "file_gib": round(file_bytes / 2**30, 2),
            "peak_rss_gib": round(peak / 2**30, 2),
            "bound_gib": round((1.3 * float32 + file_bytes) / 2**30, 2),
            "wall_s": measured["wall_s"],
        }
        print(f"  import hf {shape} (bfloat16): {out[shape]}", file=sys.stderr, flush=True)
    return out


def llama_memory_rows(memory: dict, row) -> None:
    for shape, f in memory.items():
        row(
            f"`minigpt import hf` {shape} shape, bfloat16 file of {f['file_gib']} GiB, float32 model "
            f"{f['float32_gib']} GiB: peak resident GiB (ref.: 1.3 x float32 + file)",
            f["peak_rss_gib"],
            f["bound_gib"],
            "GiB",
            "<= x1.0",
            "of-reference",
        )
