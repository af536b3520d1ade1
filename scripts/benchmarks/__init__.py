"""minigpt benchmark: every speed figure of the project, measured in one run on this machine, and
with --nanogpt the same figures for nanoGPT side by side, as ratios.

    python scripts/bench.py                                      minigpt's own figures
    python scripts/bench.py --nanogpt ../shared/anchors/nanogpt  both systems, every target
    python scripts/bench.py --nanogpt DIR --quick                skip the long full-run and 100 MB parts

Figures (each system measured in this process or in child processes started from it, alternating
where it matters, so both see the same machine at the same moment):
  - matmul peaks in float32 and bfloat16 (GFLOP/s) and the model FLOPs utilisation of training;
  - training throughput at the comparison shape (4 blocks, 4 heads, width 128, context 32, batch 64,
    BPE 1,024, biases on): minigpt's real `Trainer.train_step` in its default precision and in
    float32, against nanoGPT's train.py (compile off, float32, gradient_accumulation_steps=1);
  - time to quality: the default `minigpt train` against nanoGPT's 2,000 iterations, wall time and
    validation bits per byte; and at a small batch (16 windows) and at 6L/6H/384 context 256, the
    seconds from launch until minigpt's default recipe, and AdamW, first evaluate at or below the
    figure nanoGPT's recipe ends at, the same number of steps (`--only quality` measures this alone);
  - `minigpt train` through the CLI at both shapes, quiet and with one core kept busy (`--only cli`);
  - sampling at batch 1, 1,000 new tokens, temperature 1, sliding window past the table: minigpt's
    `generate` against nanoGPT's `GPT.generate` on a model of the same shape;
  - a sampling call as a user makes it (`minigpt sample -p "ROMEO:" -n 200`, start to exit) against
    a bare `python -c "import torch"`;
  - a 100 MB text (made here from the shipped corpus, deleted afterwards): reading, tokenizer
    fitting and caching time and peak memory, and the time to the first step of a second run;
  - a folder of 1,000 files totalling 200 MB (made the same way): `minigpt train --data FOLDER
    --steps 1`, wall time and peak memory with the token cache empty and then warm (`--only folder`
    measures this alone).
  - activation patching (`--only patching`): the `by="stage"` and `by="head"` sweeps of
    `minigpt.inspection.patching.patch` on GPT-2 small's shape (12 blocks, 12 heads, width 768,
    random weights) and on the default config's shape, a 20-token prompt whose corrupt copy
    differs in one token (at position 10, and at position 0: every row then differs), with the
    arithmetic each sweep needs and the seconds it would take at the float32 matmul peak;
  - Attention Residuals against the ordinary residual (`--only residuals`): `minigpt train` tokens/s
    at the default shape and at 12 blocks, batch 16
  - rotary and ALiBi positions against the learned table (`--only positions`): `minigpt train` tokens/s
    and sampling tokens/s of each at the comparison shape, side by side (target: rope within 10%);
  - the shipped task configs (`--only tasks`): `minigpt train -c configs/TASK.toml` for reverse, sort,
    copy and add, start to exit, and `minigpt eval --json`'s held-out exact-match accuracy;
  - fine-tuning GPT-2 small's and medium's shapes (`--only lora`): the fine-tune guide's recipe in full and
    with LoRA, with and without [train] recompute: peak resident memory and seconds per step;
  - an imported Llama-family model (`--only llama`; needs transformers): a random-weight SmolLM2-135M-shaped
    folder (scripts/random_hf_folder.py, or `--llama-folder DIR`): `minigpt import hf` start to exit,
    greedy sampling of 200 tokens at batch 1 through the API as `minigpt sample` does it against
    transformers' `generate` on the same folder, at one thread and at every core (target: 1.5x its
    tokens/s, the same tokens), and `minigpt patch --by stage` on 20-token prompts;
  - `--only llama-memory`: `minigpt import hf` of Qwen2.5-0.5B- and Llama-3.2-1B-shaped folders stored in
    bfloat16, the import's peak resident memory beside the float32 model's size and the file's;
  - `--against DIR` (with `--only versions`): this checkout against another one (a worktree of the
    commit before a change, say), the figures a change must keep: the training step, `minigpt
    train`'s rate through the CLI, sampling through the API, and `minigpt sample -n 200` start to
    exit, each in child processes of either version, alternating round by round.
The report is printed as one table and written as JSON (--json-out) with the machine's description.
Nothing here belongs in the test suite.

One module per benchmark (cli, quality, large_data, startup, versions, patching, lora, tasks,
positions, residuals, llama), each measuring its figures and writing its rows; what they share
beside them (shapes, machine, processes, training, sampling, nanogpt); report.py the rows, the table
and the JSON; comparison.py the full run; runner.py the command line. `python scripts/bench.py`
calls the runner: that file is the entry point and this package is `benchmarks`, not `bench`,
because beside a package of its name the script could not be imported by name (`import bench`
finds the package).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's minigpt, installed or not
