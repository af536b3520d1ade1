"""Write data/chapter17/ and data/chapter17-post/: chapter 17's teaching block (Example 17.2,
Table 17.1) as a run folder, and the same weights in a post-norm block (chapter 17.6, exercise 6).

    python scripts/make_chapter17.py [--reference chapter17-block.json] [--config configs/chapter17.toml]
                                     [--out DIR]

Without --config it writes both runs, each where its config's [train] out says; with one, that run.
The model is the one configs/chapter17.toml describes (float64, one pre-norm block, C = 2, two heads,
FFN 2 -> 3 -> 2, context 3, tied head) holding exactly the chapter's E, P, W_Q, W_K, W_V, W_O, W_1
and W_2, zero biases and unit norm gains. The tokenizer is a char tokenizer of three tokens,
a = 0, b = 1, c = 2: the rows of E. Before writing, the script runs the model once and checks
that its recorded stages reproduce Table 17.1 (rounded to six decimals); it refuses to write
anything else. configs/chapter17-post.toml differs in one key, norm_position = "post": the same
parameters, which the script checks are the pre-norm model's, and whose first row it checks
against chapter 17.6's R = LN1(X + MHA(X)), Y = LN2(R + FFN(R)) worked here in scalars.

Deterministic: running it again writes byte-identical files. The config.toml written into the run
folder is portable: `out = "."` (the folder itself) and an empty `data`, since nothing is trained.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
DEFAULT_REFERENCE = REPO / "data" / "chapter17-block.json"  # a copy of shared/reference/chapter17-block.json
DEFAULT_CONFIG = REPO / "configs" / "chapter17.toml"
POST_CONFIG = REPO / "configs" / "chapter17-post.toml"

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
    # the chapter's block in either order: 17.5's pre-norm (Table 17.1) or 17.6's post-norm
    chapter = dataclasses.replace(chapter_model_config(ref), norm_position=cfg.model.norm_position)
    differences = model_section_differences(dataclasses.asdict(cfg.model), dataclasses.asdict(chapter))
    if differences:
        raise MinigptError(
            f"{config}: [model] disagrees with the chapter ({'; '.join(differences)} "
            f"(config != chapter)); fix the config"
        )
    model = build_model(cfg.model, ref)
    if cfg.model.norm_position == "pre":
        check_table_17_1(model, ref)
    else:
        check_post_norm(model, ref)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, ALPHABET))
    if tokenizer.encode(ALPHABET) != list(range(len(ALPHABET))):
        raise MinigptError(f"char tokenizer gives {tokenizer.encode(ALPHABET)} for {ALPHABET!r}, not 0, 1, 2")
    run_dir = Path(out) if out is not None else cfg.run_dir
    # The run folder's own config.toml: the same sections, with paths that hold wherever it lies.
    portable = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, out=".", data=""),
        source=f"configs/{Path(config).name} via scripts/make_chapter17.py; teaching weights, nothing trained",
    )
    write_model_run(run_dir, portable, model, tokenizer)
    return run_dir


def check_post_norm(model, ref: dict) -> None:
    """Refuse a post-norm model that is not the pre-norm one's weights in 17.6's order: its
    parameters must be the Table-17.1-checked model's, and its first row of Y must be the scalar
    R = LN1(X + MHA(X)), Y = LN2(R + FFN(R)) (position 0 reads only its own key, weight 1)."""
    import torch

    from minigpt.model import stages
    from minigpt.model.recorder import Recorder

    pre = build_model(dataclasses.replace(model.cfg, norm_position="pre"), ref)
    check_table_17_1(pre, ref)
    theirs, ours = pre.state_dict(), model.state_dict()
    if theirs.keys() != ours.keys() or any(not torch.equal(theirs[k], ours[k]) for k in ours):
        raise MinigptError("the post-norm model's parameters are not the pre-norm model's")
    recorder = Recorder(model.cfg)
    with torch.inference_mode():
        model(torch.tensor([ref["token_ids"]]), recorder=recorder)
    got = recorder[stages.block_name(0, stages.OUTPUT)][0, 0].tolist()
    expected = _post_norm_first_row(ref)
    if any(abs(a - b) > 1e-12 for a, b in zip(got, expected)):
        raise MinigptError(f"the post-norm model's first row of Y is {got}, chapter 17.6's order gives {expected}")


def _post_norm_first_row(ref: dict) -> list[float]:
    """Y_post at position 0, in scalars: there attention reads only its own key, with weight 1, so
    MHA(X)_0 = X_0 W_V W_O (each head's value is its slice of X_0 W_V, joined back in order)."""

    def times(row, matrix):  # row vector @ matrix, matrix as the chapter writes it ([in][out])
        return [math.fsum(row[i] * matrix[i][j] for i in range(len(row))) for j in range(len(matrix[0]))]

    def plus(a, b):
        return [x + y for x, y in zip(a, b)]

    def norm(row):  # gamma 1, beta 0
        mean = math.fsum(row) / len(row)
        variance = math.fsum((v - mean) ** 2 for v in row) / len(row)
        return [(v - mean) / math.sqrt(variance + ref["eps"]) for v in row]

    x = plus(ref["E_token_table"][ref["token_ids"][0]], ref["P_position_table"][0])
    r = norm(plus(x, times(times(x, ref["W_V"]), ref["W_O"])))
    hidden = [max(0.0, v) for v in plus(times(r, ref["W_1"]), ref["b_1"])]
    return norm(plus(r, plus(times(hidden, ref["W_2"]), ref["b_2"])))


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
        default=None,
        help="config whose [model] section the weights must fit (default: configs/chapter17.toml and "
        "configs/chapter17-post.toml, each written)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="run folder to write (default: the config's [train] out, data/chapter17)"
    )
    args = parser.parse_args(argv)
    configs = [args.config] if args.config is not None else [DEFAULT_CONFIG, POST_CONFIG]
    if args.out is not None and len(configs) > 1:
        configs = [DEFAULT_CONFIG]  # --out alone: the pre-norm run there (pass --config for the other)
    try:
        for config in configs:
            run_dir = make(args.reference, config, args.out)
            checked = (
                "Table 17.1 reproduced"
                if load_config(config).model.norm_position == "pre"
                else ("the same weights, post-norm (chapter 17.6)")
            )
            print(f"wrote {run_dir} (config.toml, tokenizer.json, checkpoint.pt); {checked}")
    except MinigptError as exc:
        print(f"make_chapter17: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
