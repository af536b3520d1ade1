"""Write data/chapter17/: chapter 17's teaching block (Example 17.2, Table 17.1) as a run folder.

    python scripts/make_chapter17.py [--reference chapter17-block.json] [--config configs/chapter17.toml]
                                     [--out DIR]

The model is the one configs/chapter17.toml describes (float64, one pre-norm block, C = 2, two heads,
FFN 2 -> 3 -> 2, context 3, tied head) holding exactly the chapter's E, P, W_Q, W_K, W_V, W_O, W_1
and W_2, zero biases and unit norm gains. The tokenizer is a char tokenizer of three tokens,
a = 0, b = 1, c = 2: the rows of E. Before writing, the script runs the model once and checks
that its recorded stages reproduce Table 17.1 (rounded to six decimals); it refuses to write
anything else.

Deterministic: running it again writes byte-identical files. The config.toml written into the run
folder is portable: `out = "."` (the folder itself) and an empty `data`, since nothing is trained.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
DEFAULT_REFERENCE = REPO / "data" / "chapter17-block.json"  # a copy of shared/reference/chapter17-block.json
DEFAULT_CONFIG = REPO / "configs" / "chapter17.toml"

if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from minigpt.config import load_config, model_section_differences  # noqa: E402
from minigpt.errors import MinigptError  # noqa: E402
from minigpt.model.chapter17 import build_model, chapter_model_config, check_table_17_1  # noqa: E402
from minigpt.runs.folder import write_model_run  # noqa: E402
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer  # noqa: E402

ALPHABET = "abc"  # one character per row of E


def read_reference(path: Path) -> dict:
    if not path.is_file():
        raise MinigptError(f"chapter reference {path} does not exist; pass --reference path/to/chapter17-block.json")
    return json.loads(path.read_text(encoding="utf-8"))


def make(reference: Path, config: Path, out: Path | None) -> Path:
    ref = read_reference(reference)
    cfg = load_config(config)
    differences = model_section_differences(
        dataclasses.asdict(cfg.model), dataclasses.asdict(chapter_model_config(ref))
    )
    if differences:
        raise MinigptError(
            f"{config}: [model] disagrees with the chapter ({'; '.join(differences)} "
            f"(config != chapter)); fix the config"
        )
    model = build_model(cfg.model, ref)
    check_table_17_1(model, ref)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, ALPHABET))
    if tokenizer.encode(ALPHABET) != list(range(len(ALPHABET))):
        raise MinigptError(f"char tokenizer gives {tokenizer.encode(ALPHABET)} for {ALPHABET!r}, not 0, 1, 2")
    run_dir = Path(out) if out is not None else cfg.run_dir
    # The run folder's own config.toml: the same sections, with paths that hold wherever it lies.
    portable = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, out=".", data=""),
        source="configs/chapter17.toml via scripts/make_chapter17.py; teaching weights, nothing trained",
    )
    write_model_run(run_dir, portable, model, tokenizer)
    return run_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference",
        type=Path,
        default=DEFAULT_REFERENCE,
        help=f"the chapter's numbers (default: {DEFAULT_REFERENCE})",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="config whose [model] section the weights must fit (default: configs/chapter17.toml)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="run folder to write (default: the config's [train] out, data/chapter17)"
    )
    args = parser.parse_args(argv)
    try:
        run_dir = make(args.reference, args.config, args.out)
    except MinigptError as exc:
        print(f"make_chapter17: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {run_dir} (config.toml, tokenizer.json, checkpoint.pt); Table 17.1 reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
