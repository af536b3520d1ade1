"""`[train]`: what a run trains on and how (the text or a task, a fine-tune and its LoRA, the
optimizer and its schedule, what it records); and the keys added after runs were first written."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import spec
from .shipped import DEFAULT_CORPUS

# [train] keys added after checkpoints were first written, as LATER_MODEL_KEYS for [model]: a run
# trained before tasks existed trained on text, task = "none".
LATER_TRAIN_KEYS = (
    "task",
    "task_length",
    "task_lengths",
    "task_held_out",
    "recompute",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",
    "exercise_file",
    "task_start",
)
LORA_TARGETS = ("qkv", "out", "W1", "W2")

TASKS = ("reverse", "sort", "copy", "add")


@dataclass
class TrainConfig:
    data: str | list[str] = spec(
        str(DEFAULT_CORPUS),
        "UTF-8 text file to train on, a folder (every *.txt under it, in sorted order), or a list of files and "
        "folders, joined with an end-of-text token between two files (default: the shipped Tiny Shakespeare)",
    )
    out: str = spec("", "run folder to write; empty means runs/<config name> under the current directory")
    task: str = spec(
        "none",
        "train on a generated task instead of data: reverse, sort or copy a string of letters, or add two "
        "numbers; examples drawn from the seed, a character tokenizer, the loss on the answer only",
        choices=("none", *TASKS),
    )
    task_length: int = spec(
        0,
        "letters of each task input (reverse, sort, copy), or digits of each number (add); 0: 8 letters, 3 digits",
        minimum=0,
    )
    task_lengths: str = spec(
        "",
        'mixed lengths: "A-B" trains on every task_length from A to B, each example\'s drawn uniformly, '
        "task_held_out of each length held out; empty: task_length alone",
    )
    task_start: str = spec(
        "",
        "a constant text every task prompt starts with (Kazemnejad et al. 2023's prompts start with fixed text, "
        'and their argument for positions = none needs a constant first token), e.g. ">"; empty: none',
    )
    task_held_out: int = spec(1000, "task examples held out for evaluation, never drawn for training", minimum=1)
    init_from: str = spec(
        "",
        "a run folder to fine-tune: this run starts from its weights and keeps its model section and "
        "tokenizer (empty: fresh weights)",
    )
    init_checkpoint: str = spec("last", "which weights of the init_from run: last, or best", choices=("last", "best"))
    exercise_file: str = spec(
        "", "the learner's file of the model's exercise (empty: exercises/NAME.py in the current folder)"
    )
    recompute: bool = spec(
        False,
        "keep only each block's input for the backward pass and compute the rest again there (less memory, "
        "about a third more arithmetic)",
    )
    lora_rank: int = spec(
        0,
        "LoRA: train a rank-r update B A of each targeted matrix of the init_from run, its weights frozen "
        "(0: fine-tune every weight)",
        minimum=0,
    )
    lora_alpha: float = spec(16.0, "LoRA's scale numerator: the update is (lora_alpha / lora_rank) B A", positive=True)
    lora_dropout: float = spec(
        0.0, "dropout on a LoRA update's input (training only)", minimum=0.0, maximum=1.0, exclusive_max=True
    )
    lora_targets: str = spec(
        "qkv,out,W1,W2",
        "the matrices LoRA adapts in every block, comma-separated: qkv (attention's W_Q | W_K | W_V), out "
        "(W_O), W1 and W2 (the FFN's)",
    )
    val_fraction: float = spec(
        0.1, "contiguous tail of the text kept for validation", positive=True, maximum=1.0, exclusive_max=True
    )
    batch_size: int = spec(64, "windows per optimizer micro-step", minimum=1)
    grad_accum: int = spec(1, "micro-steps accumulated per optimizer step", minimum=1)
    steps: int = spec(
        750,
        "optimizer steps; 0: the run holds its initial weights (as model.init drew them), read before any update",
        minimum=0,
    )
    learning_rate: float = spec(3e-3, "peak learning rate", positive=True)
    min_lr: float = spec(1e-4, "learning rate at the end of the cosine decay", minimum=0.0)
    warmup_steps: int = spec(100, "linear warmup steps", minimum=0)
    optimizer: str = spec(
        "auto",
        "adamw for every parameter, muon for the blocks' weight matrices with AdamW for the tables, "
        "head, gains and biases, or auto: muon where its per-step orthogonalisation, timed on this machine "
        "before the first step, costs under half the step's forward and backward (small batches make it dear), "
        "else adamw",
        choices=("adamw", "muon", "auto"),
    )
    muon_learning_rate: float = spec(
        0.02, "peak learning rate of Muon (optimizer = muon), on the same schedule", positive=True
    )
    weight_decay: float = spec(0.1, "decoupled weight decay, applied to matrices only", minimum=0.0)
    beta1: float = spec(0.9, "AdamW beta1", minimum=0.0, maximum=1.0, exclusive_max=True)
    beta2: float = spec(0.99, "AdamW beta2", minimum=0.0, maximum=1.0, exclusive_max=True)
    grad_clip: float = spec(1.0, "clip the global gradient norm to this (0 disables)", minimum=0.0)
    eval_interval: int = spec(250, "steps between validation evaluations", minimum=1)
    eval_batches: int = spec(16, "fixed validation batches per evaluation", minimum=1)
    log_interval: int = spec(10, "steps between training-loss records in metrics.jsonl", minimum=1)
    checkpoint_interval: int = spec(250, "steps between checkpoints (also saved at the end)", minimum=1)
    seed: int = spec(1337, "seed for initialisation, batches and dropout")
    device: str = spec(
        "auto",
        "where train, sample and trace compute; auto picks cuda, then mps, else cpu",
        choices=("auto", "cpu", "cuda", "mps"),
    )
    threads: int = spec(
        0,
        "CPU threads for torch in every command (0: for training, every core unless fewer time 1.3x "
        "faster before the first step, as when another program keeps a core busy; fixed for the whole run, "
        "which a resume continues at; one for sampling a single sample and for trace)",
        minimum=0,
    )
    adaptive_threads: bool = spec(
        False,
        "with threads = 0: time thread counts again during training when steps slow down, and switch to the "
        "fastest; gives up bitwise equality between runs and across a resume",
    )
    tensorboard: bool = spec(
        False, "also write the logged values as TensorBoard event files in the run folder (the tensorboard extra)"
    )
    sample_every: int = spec(
        0, "steps between short samples printed during training and kept in metrics.jsonl (0 = off)", minimum=0
    )
    sample_prompt: str = spec("", "prompt of the samples during training; empty starts from a newline")
    sample_tokens: int = spec(48, "new tokens in each sample during training", minimum=1)
    precision: str = spec(
        "auto",
        "matmul precision while training: auto (bfloat16 where it times faster on this machine "
        "at the model's shapes, else float32), float32 or bfloat16; weights stay float32",
        choices=("auto", "float32", "bfloat16"),
    )


def length_range(text: str) -> range | None:
    """`[train] task_lengths` (and eval's `--task-length`) as the lengths it names: "N" or "A-B" with
    1 <= A <= B; None when the text is neither."""
    low, dash, high = text.strip().partition("-")
    if not low.strip().isdecimal() or (dash and not high.strip().isdecimal()):
        return None
    first, last = int(low), int(high) if dash else int(low)
    return range(first, last + 1) if 1 <= first <= last else None


def lora_targets(text: str) -> list[str]:
    """`[train] lora_targets` as names, in the order given."""
    return [name.strip() for name in text.split(",") if name.strip()]
