"""The run folder's layout: what `train` writes and every reading command reads back.

    run/config.toml      the resolved config, exactly as used: a run describes itself
    run/tokenizer.json   loads with tokenizers.Tokenizer.from_file
    run/checkpoint.pt    model, [model] section, optimizer, step, RNG states, hashes of config,
                         tokenizer and corpus
    run/best.pt          the model at its best validation loss so far (no optimizer state)
    run/metrics.jsonl    one JSON object per logged step and per evaluation
    run/origin.json      where the starting weights came from (an import, a fine-tune's source)
    run/exercises/NAME.py  the learner's file a model of an exercise was trained with (a copy; the
                         checkpoint records its path and sha256, and every reading checks that file)
    run/tensorboard/     TensorBoard's event files, with `[train] tensorboard = true`

Every file is written atomically (io.py).
"""

from __future__ import annotations

CONFIG_FILE = "config.toml"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_FILE = "checkpoint.pt"
BEST_FILE = "best.pt"  # the weights at the best validation loss so far (weights and [model] only)
CHECKPOINTS = {"last": CHECKPOINT_FILE, "best": BEST_FILE}
METRICS_FILE = "metrics.jsonl"
EXERCISE_COPIES = "exercises"  # run/exercises/NAME.py: the learner's file, as the run was trained with it
TENSORBOARD_FOLDER = "tensorboard"  # run/tensorboard/events.out.tfevents.*, with [train] tensorboard = true
ORIGIN_FILE = "origin.json"  # where a run's starting weights came from (a fine-tune's source), when not fresh
FORMAT_VERSION = 1
