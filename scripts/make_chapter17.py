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
DEFAULT_REFERENCE = HERE.parents[2] / "shared" / "reference" / "chapter17-block.json"
DEFAULT_CONFIG = REPO / "configs" / "chapter17.toml"

if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from minigpt.checkpoint import write_model_run  # noqa: E402
from minigpt.config import ModelConfig, load_config, model_section_differences  # noqa: E402
from minigpt.errors import MinigptError  # noqa: E402
from minigpt.model import MiniGPT, Recorder  # noqa: E402
from minigpt.tokenizer import TextTokenizer, train_tokenizer  # noqa: E402

# Table 17.1's row names in chapter17-block.json -> the recorder's names for the same stages.
TABLE_TO_RECORDER = {
    "X (token plus position)": "input",
    "norm1": "blocks.0.norm1",
    "attention": "blocks.0.attention",
    "residual1": "blocks.0.residual1",
    "norm2": "blocks.0.norm2",
    "hidden (FFN after ReLU)": "blocks.0.hidden",
    "ffn (FFN output)": "blocks.0.ffn",
    "output (block output Y)": "blocks.0.output",
}
ALPHABET = "abc"  # one character per row of E


def read_reference(path: Path) -> dict:
    if not path.is_file():
        raise MinigptError(f"chapter reference {path} does not exist; pass --reference "
                           f"path/to/chapter17-block.json")
    return json.loads(path.read_text(encoding="utf-8"))


def chapter_model_config(ref: dict) -> ModelConfig:
    """What the chapter's matrices require; the config file must agree with it."""
    E, P, W_1 = ref["E_token_table"], ref["P_position_table"], ref["W_1"]
    return ModelConfig(context=len(P), n_layer=1, n_head=2, n_embd=len(E[0]), ffn_hidden=len(W_1[0]),
                       norm_eps=ref["eps"], dropout=0.0, norm="layernorm", norm_position="pre",
                       activation="relu", bias=True, tie_embeddings=True, dtype="float64")


def build_model(cfg: ModelConfig, ref: dict) -> MiniGPT:
    def t(rows) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.float64)

    torch.manual_seed(0)  # every parameter is overwritten below; the seed only makes that obvious
    model = MiniGPT(cfg, vocab_size=len(ref["E_token_table"])).eval()
    block = model.blocks[0]
    with torch.no_grad():
        model.token_table.weight.copy_(t(ref["E_token_table"]))  # also the head (tied)
        model.position_table.weight.copy_(t(ref["P_position_table"]))
        # The chapter multiplies row vectors on the right (x @ W); nn.Linear stores W as [out, in].
        block.attention.qkv.weight.copy_(torch.cat([t(ref["W_Q"]).T, t(ref["W_K"]).T, t(ref["W_V"]).T]))
        block.attention.qkv.bias.zero_()
        block.attention.out.weight.copy_(t(ref["W_O"]).T)
        block.attention.out.bias.zero_()
        block.ffn.W1.weight.copy_(t(ref["W_1"]).T)
        block.ffn.W1.bias.copy_(t(ref["b_1"]))
        block.ffn.W2.weight.copy_(t(ref["W_2"]).T)
        block.ffn.W2.bias.copy_(t(ref["b_2"]))
        for norm in (block.norm1, block.norm2, model.final_norm):
            norm.weight.fill_(1.0)
            norm.bias.zero_()
    assert model.head.weight is model.token_table.weight
    return model


def check_table_17_1(model: MiniGPT, ref: dict) -> None:
    """Refuse weights whose recorded stages do not round to the chapter's table."""
    recorder = Recorder()
    with torch.inference_mode():
        model(torch.tensor([ref["token_ids"]]), recorder=recorder)
    wrong = []
    for name, expected in ref["first_position_trace_rounded_6"].items():
        stage = recorder[TABLE_TO_RECORDER[name]]
        row = [round(v, 6) for v in stage[0, 0].tolist()]
        if row != expected["row"] or list(stage.shape) != [1, *expected["shape"]]:
            wrong.append(f"{name}: {row} {list(stage.shape)} != {expected['row']} {expected['shape']}")
    Y = [[round(v, 6) for v in row] for row in recorder["blocks.0.output"][0].tolist()]
    if Y != ref["block_output_Y_rounded_6"]:
        wrong.append(f"Y: {Y} != {ref['block_output_Y_rounded_6']}")
    if wrong:
        raise MinigptError("the model does not reproduce Table 17.1: " + "; ".join(wrong))


def make(reference: Path, config: Path, out: Path | None) -> Path:
    ref = read_reference(reference)
    cfg = load_config(config)
    differences = model_section_differences(dataclasses.asdict(cfg.model),
                                            dataclasses.asdict(chapter_model_config(ref)))
    if differences:
        raise MinigptError(f"{config}: [model] disagrees with the chapter ({'; '.join(differences)} "
                           f"(config != chapter)); fix the config")
    model = build_model(cfg.model, ref)
    check_table_17_1(model, ref)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, ALPHABET))
    if tokenizer.encode(ALPHABET) != list(range(len(ALPHABET))):
        raise MinigptError(f"char tokenizer gives {tokenizer.encode(ALPHABET)} for {ALPHABET!r}, not 0, 1, 2")
    run_dir = Path(out) if out is not None else cfg.run_dir
    # The run folder's own config.toml: the same sections, with paths that hold wherever it lies.
    portable = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, out=".", data=""),
        source="configs/chapter17.toml via scripts/make_chapter17.py; teaching weights, nothing trained")
    write_model_run(run_dir, portable, model, tokenizer)
    return run_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE,
                        help=f"the chapter's numbers (default: {DEFAULT_REFERENCE})")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="config whose [model] section the weights must fit (default: configs/chapter17.toml)")
    parser.add_argument("--out", type=Path, default=None,
                        help="run folder to write (default: the config's [train] out, data/chapter17)")
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
