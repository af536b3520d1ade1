"""runs.layout: carved from run.py (docstring to write)

The run folder: its layout, creating and replacing it, identity and resume checks, the metrics
log, and loading its model for reading.

    run/config.toml      the resolved config, exactly as used: a run describes itself
    run/tokenizer.json   loads with tokenizers.Tokenizer.from_file
    run/checkpoint.pt    model, [model] section, optimizer, step, RNG states, hashes of config,
                         tokenizer and corpus
    run/best.pt          the model at its best validation loss so far (no optimizer state)
    run/metrics.jsonl    one JSON object per logged step and per evaluation

Every file is written atomically (io.py). Checkpoints load with `weights_only=True`: a checkpoint
can hold tensors and plain values, never code. The model is always built from the [model] section
stored in the checkpoint, never from a config that merely names the run.
"""

from __future__ import annotations

CONFIG_FILE = "config.toml"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_FILE = "checkpoint.pt"
BEST_FILE = "best.pt"  # the weights at the best validation loss so far (weights and [model] only)
CHECKPOINTS = {"last": CHECKPOINT_FILE, "best": BEST_FILE}
METRICS_FILE = "metrics.jsonl"
ORIGIN_FILE = "origin.json"  # where a run's starting weights came from (a fine-tune's source), when not fresh
FORMAT_VERSION = 1
