"""`minigpt trace` through the CLI: chapter 17's Table 17.1, the JSON schema, every refusal, the
numbers coming from the model's own forward pass, and an 80-column text view.

The chapter tests use the shipped configs/chapter17.toml and data/chapter17/, so they check those files
too; another test rebuilds the folder with scripts/make_chapter17.py and compares it byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minigpt.cli import app
from minigpt.config import load_config
from minigpt.inspection.text_format import number, show_token
from minigpt.model.gpt import MiniGPT
from minigpt.model.stages import POST_NORM, PRE_NORM
from minigpt.runs.folder import write_model_run
from minigpt.runs.reading import load_model
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
CHAPTER_CONFIG = REPO / "configs" / "chapter17.toml"
CHAPTER_RUN = REPO / "data" / "chapter17"
runner = CliRunner()

# Table 17.1 (first position) and the other rows of X = E + P and Y, rounded to six decimals.
TABLE_17_1 = {
    "= input": ("[1.000000, 0.000000]", "[1, 3, 2]"),
    "norm1": ("[0.999980, -0.999980]", "[1, 3, 2]"),
    "attention": ("[0.000000, 1.999960]", "[1, 3, 2]"),
    "residual1": ("[1.000000, 1.999960]", "[1, 3, 2]"),
    "norm2": ("[-0.999980, 0.999980]", "[1, 3, 2]"),
    "hidden": ("[0.000000, 1.999960, 0.999980]", "[1, 3, 3]"),
    "ffn": ("[0.999980, 0.999980]", "[1, 3, 2]"),
    "output": ("[1.999980, 2.999940]", "[1, 3, 2]"),
}
X_ROWS = ["[1.000000, 0.000000]", "[0.000000, 2.000000]", "[2.000000, 1.000000]"]
Y_ROWS = ["[1.999980, 2.999940]", "[0.999912, 1.476742]", "[2.999964, 3.746396]"]

CHAPTER_POSITION_0 = """\
trace of position 0 (token 'a', id 0) in a prompt of 3 token(s)
model: 1 block(s), 2 heads, width 2, FFN 3, 3 tokens, float64, tied head
tokens:  0:'a'  1:'b'  2:'c'
pre-norm block: norm1 = LN1(input); attention = MHA(norm1);
  residual1 = input + attention; norm2 = LN2(residual1);
  hidden = relu(norm2 W1 + b1); ffn = hidden W2 + b2; output = residual1 + ffn
rows: position 0 of each recorded stage; shape: the whole array

block 0 of 1
  stage         row at position 0               shape
  token 'a'     [1.000000, 0.000000]            [3, 2]
  + position 0  [0.000000, 0.000000]            [3, 2]
  = input       [1.000000, 0.000000]            [1, 3, 2]
  norm1         [0.999980, -0.999980]           [1, 3, 2]
  attention     [0.000000, 1.999960]            [1, 3, 2]
  residual1     [1.000000, 1.999960]            [1, 3, 2]
  norm2         [-0.999980, 0.999980]           [1, 3, 2]
  hidden        [0.000000, 1.999960, 0.999980]  [1, 3, 3]
  ffn           [0.999980, 0.999980]            [1, 3, 2]
  output        [1.999980, 2.999940]            [1, 3, 2]
  attention weights [1, 2, 3, 3]: position 0 over the keys it can see
    key  token    head 0    head 1
      0  'a'    1.000000  1.000000

after the last block
  final_norm  [-0.999980, 0.999980]  [1, 3, 2]
next token after position 0: softmax(final_norm row @ head), top 3
  rank  id  token        logit  probability
     1   1  'b'       0.999980     0.665235
     2   2  'c'       0.000000     0.244731
     3   0  'a'      -0.999980     0.090033

logit lens: each block's output row, through final_norm and the head, softmax:
what the model would predict if it stopped after that block
  block 0   'b' 0.665235   'c' 0.244731   'a' 0.090033
"""


def trace(*args: str):
    return runner.invoke(app, ["trace", *args])


def chapter(*args: str):
    return trace("-c", str(CHAPTER_CONFIG), *args)


def ok(result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.stderr, result.exception)
    return result.stdout


def table_rows(text: str) -> dict[str, tuple[str, str]]:
    """`  label  [row]  [shape]` lines of the text view -> {label: (row, shape)} (first block only)."""
    rows = {}
    for line in text.splitlines():
        match = re.fullmatch(r"  (\S+(?: \S+)?)\s+(\[[^\]]*\])\s+(\[[\d, ]+\])", line)
        if match and match.group(1) not in rows:
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


# ------------------------------------------------------------------ chapter 17 through the CLI


def test_chapter_example_prints_table_17_1_exactly():
    out = ok(chapter("--ids", "0,1,2", "--position", "0", "--digits", "6"))
    assert out == CHAPTER_POSITION_0
    assert max(len(line) for line in out.splitlines()) <= 80
    rows = table_rows(out)
    for label, expected in TABLE_17_1.items():
        assert rows[label] == expected, label


@pytest.mark.parametrize("position", [0, 1, 2])
def test_each_position_prints_its_row_of_x_and_y(position):
    rows = table_rows(ok(chapter("--ids", "0,1,2", "--position", str(position), "--digits", "6")))
    assert rows["= input"] == (X_ROWS[position], "[1, 3, 2]")
    assert rows["output"] == (Y_ROWS[position], "[1, 3, 2]")
    assert rows["hidden"][1] == "[1, 3, 3]"


def test_prompt_text_and_ids_trace_the_same_tokens():
    by_ids = ok(chapter("--ids", "0,1,2", "--digits", "6"))
    assert ok(chapter("-p", "abc", "--digits", "6")) == by_ids
    # the default position is the last token, and a negative one counts from the end
    assert by_ids.startswith("trace of position 2 (token 'c', id 2)")
    assert ok(chapter("-p", "abc", "--position", "-3", "--digits", "6")) == ok(
        chapter("-p", "abc", "--position", "0", "--digits", "6")
    )


def test_digits_sets_the_decimals():
    rows = table_rows(ok(chapter("--ids", "0,1,2", "--position", "0", "--digits", "2")))
    assert rows["output"] == ("[2.00, 3.00]", "[1, 3, 2]")
    assert rows["norm1"] == ("[1.00, -1.00]", "[1, 3, 2]")


def test_json_schema_holds_full_rows():
    data = json.loads(ok(chapter("--ids", "0,1,2", "--position", "1", "--json")))
    assert set(data) == {"position", "ids", "tokens", "model", "input", "blocks", "final_norm", "next_tokens"}
    assert data["position"] == 1 and data["ids"] == [0, 1, 2] and data["tokens"] == ["a", "b", "c"]
    assert data["input"] == {
        "token_row": [0.0, 1.0],
        "position_row": [0.0, 1.0],
        "row": [0.0, 2.0],
        "shape": [1, 3, 2],
        "token_table_shape": [3, 2],
        "position_table_shape": [3, 2],
    }
    assert data["model"]["norm_position"] == "pre" and data["model"]["n_layer"] == 1
    [block] = data["blocks"]
    assert set(block) == {"index", "input", "stages", "shapes", "attention_weights", "attention_shape", "logit_lens"}
    assert block["index"] == 0 and block["input"] == {"row": [0.0, 2.0], "shape": [1, 3, 2]}
    assert list(block["stages"]) == list(PRE_NORM) == list(block["shapes"])
    assert block["shapes"]["hidden"] == [1, 3, 3] and block["shapes"]["output"] == [1, 3, 2]
    assert [round(v, 6) for v in block["stages"]["output"]] == [0.999912, 1.476742]
    assert block["attention_shape"] == [1, 2, 3, 3]
    weights = block["attention_weights"]  # [head][visible key]
    assert len(weights) == 2 and all(len(head) == 2 for head in weights)
    assert all(abs(sum(head) - 1.0) < 1e-15 for head in weights)
    for ranking in (block["logit_lens"], data["next_tokens"]):
        assert [set(c) for c in ranking] == [{"token", "id", "probability", "logit"}] * 3
        assert sorted(c["id"] for c in ranking) == [0, 1, 2]
        assert abs(sum(c["probability"] for c in ranking) - 1.0) < 1e-12
        assert [c["probability"] for c in ranking] == sorted((c["probability"] for c in ranking), reverse=True)
    assert data["final_norm"]["shape"] == [1, 3, 2] and len(data["final_norm"]["row"]) == 2
    # one block, so its logit lens is the model's own next-token prediction
    assert block["logit_lens"] == data["next_tokens"]


def test_traced_final_norm_row_times_head_gives_the_forward_logits_float64():
    data = json.loads(ok(chapter("--ids", "0,1,2", "--position", "2", "--json")))
    cfg = load_config(CHAPTER_CONFIG)
    model, _ = load_model(cfg)
    with torch.no_grad():
        logits, _ = model(torch.tensor([[0, 1, 2]]))
        from_trace = torch.tensor(data["final_norm"]["row"], dtype=torch.float64) @ model.head.weight.T
    assert torch.allclose(from_trace, logits[0, 2], rtol=0, atol=1e-12)
    probabilities = torch.softmax(logits[0, 2], -1)
    for c in data["next_tokens"]:
        assert abs(c["logit"] - float(logits[0, 2, c["id"]])) <= 1e-12
        assert abs(c["probability"] - float(probabilities[c["id"]])) <= 1e-12


def test_regenerating_the_chapter_folder_gives_the_shipped_files(tmp_path):
    spec = importlib.util.spec_from_file_location("make_chapter17", REPO / "scripts" / "make_chapter17.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    if not script.DEFAULT_REFERENCE.is_file():
        pytest.skip(f"chapter reference {script.DEFAULT_REFERENCE} not present")
    assert script.main(["--out", str(tmp_path / "chapter17")]) == 0
    for name in ("config.toml", "tokenizer.json", "checkpoint.pt"):
        assert (tmp_path / "chapter17" / name).read_bytes() == (CHAPTER_RUN / name).read_bytes(), name


# ------------------------------------------------------------------ refusals: one line, exit 2


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--ids", "0,1,2", "--position", "3"],
            "--position 3 is beyond the prompt: it has 3 token(s), positions 0..2 (or -3..-1 from the end)",
        ),
        (
            ["--ids", "0,1", "--position", "-3"],
            "--position -3 is beyond the prompt: it has 2 token(s), positions 0..1 (or -2..-1 from the end)",
        ),
        (
            ["--ids", "0,1,2,0"],
            "the prompt has 4 tokens but the position table has 3 rows ([model] context = 3); the model has no "
            "row for position 3 and will not invent one, so use at most 3 tokens: shorten the prompt",
        ),
        (
            ["-p", "abcab"],
            "the prompt has 5 tokens but the position table has 3 rows ([model] context = 3); the model has no "
            "row for position 3 and will not invent one, so use at most 3 tokens: shorten the prompt",
        ),
        (["-p", ""], "the prompt is empty; trace needs at least one token: pass --prompt TEXT or --ids 3,1,4"),
        (["--ids", ""], "--ids is empty; trace needs at least one token id, e.g. --ids 3,1,4"),
        (
            ["--ids", "0,3"],
            "token id 3 is not in the vocabulary: this model has 3 tokens, ids 0..2; use ids the tokenizer produced",
        ),
        (
            ["--ids", "-1"],
            "token id -1 is not in the vocabulary: this model has 3 tokens, ids 0..2; use ids the tokenizer produced",
        ),
        (["--ids", "0,x"], "--ids '0,x': 'x' is not an integer; give comma-separated token ids, e.g. --ids 3,1,4"),
        (
            ["--ids", "0", "--block", "1"],
            "--block 1 does not exist: the model has 1 block(s), 0..0 (or -1..-1 from the end)",
        ),
        (
            ["--ids", "0", "--block", "-2"],
            "--block -2 does not exist: the model has 1 block(s), 0..0 (or -1..-1 from the end)",
        ),
        (
            ["-p", "abd"],
            "text has 1 character(s) the char tokenizer never saw in training: 'd'; remove them "
            'or train with tokenizer.kind = "bpe" or "byte"',
        ),
        (["-p", "a", "--ids", "0"], "give the tokens to trace with exactly one of --prompt TEXT or --ids 3,1,4"),
        ([], "give the tokens to trace with exactly one of --prompt TEXT or --ids 3,1,4"),
        (["--ids", "0", "--digits", "16"], "--digits 16 is out of range; show 0..15 decimals"),
        (["--ids", "0", "--top", "0"], "--top 0 is too small; show at least 1 next-token candidate"),
    ],
)
def test_refusals_are_one_line_with_a_nonzero_exit(args, message):
    result = chapter(*args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"minigpt: error: {message}\n"


def test_a_checkpoint_that_disagrees_with_the_config_is_refused():
    result = chapter("--ids", "0", "--set", "model.n_head=1")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "was trained with another [model] section" in result.stderr
    assert "n_head: 1 != 2" in result.stderr


# ------------------------------------------------------------------ a default-sized model (width 128)

ALPHABET = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
PROMPT = "ROMEO:\nIt's 'what'? Say it, Nurs"  # 32 characters: the whole default position table


def make_run(folder: Path, **model) -> Path:
    """A random-init model with a char tokenizer, written as a run folder with its config."""
    config = folder / "config.toml"
    lines = [
        "[model]",
        *(f"{k} = {json.dumps(v)}" for k, v in model.items()),
        "[tokenizer]",
        'kind = "char"',
        "[train]",
        'out = "run"',
    ]
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = load_config(config)
    torch.manual_seed(0)
    net = MiniGPT(cfg.model, vocab_size=len(ALPHABET))
    with torch.no_grad():  # non-zero biases and gains, so no stage is trivially zero or one
        for name, p in net.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    write_model_run(cfg.run_dir, cfg, net, TextTokenizer(train_tokenizer("char", 0, ALPHABET)))
    return config


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("wide"))  # the defaults: 4 blocks, 4 heads, 128, 512, context 32


def test_prompt_longer_than_position_table_is_refused(wide):
    result = trace("-c", str(wide), "-p", PROMPT + "!")
    assert result.exit_code == 2
    assert result.stderr.startswith("minigpt: error: the prompt has 33 tokens but the position table has 32 rows")


@pytest.mark.parametrize("digits, head_tables", [("4", 4), ("8", 4), ("15", 8)])
def test_text_view_fits_80_columns_on_a_width_128_model(wide, digits, head_tables):
    out = ok(trace("-c", str(wide), "-p", PROMPT, "--position", "6", "--digits", digits, "--top", "8"))
    too_long = [line for line in out.splitlines() if len(line) > 80]
    assert too_long == []
    assert "\t" not in out
    assert "trace of position 6 (token '\\n', id 0) in a prompt of 32 token(s)" in out
    assert re.search(r"^  hidden +\[.*, \.\.\.\] +\[1, 32, 512\]$", out, re.M)
    assert re.search(r"^  output +\[.*, \.\.\.\] +\[1, 32, 128\]$", out, re.M)
    assert out.count("block 3 of 4") == 1
    # per block, one attention table when 4 heads fit across, two when 15 decimals make them wide
    assert out.count("    key  token ") == head_tables


def test_wide_rows_show_leading_coordinates_and_true_statistics(wide):
    data = json.loads(ok(trace("-c", str(wide), "-p", PROMPT, "--json")))
    text = ok(trace("-c", str(wide), "-p", PROMPT))
    row = data["blocks"][3]["stages"]["output"]
    assert len(row) == 128
    lines = text.splitlines()
    at = max(i for i, line in enumerate(lines) if line.startswith("  output "))  # block 3 is last
    shown = re.search(r"\[(.*), \.\.\.\]", lines[at]).group(1).split(", ")
    assert 2 <= len(shown) < 128
    assert shown == [f"{v:.4f}".replace("-0.0000", "0.0000") for v in row[: len(shown)]]
    mean = sum(row) / 128
    std = math.sqrt(sum((v - mean) ** 2 for v in row) / 128)
    norm = math.sqrt(sum(v * v for v in row))
    assert lines[at + 1].split() == ["mean", f"{mean:.4f}", "std", f"{std:.4f}", "norm", f"{norm:.4f}"]


def test_traced_final_norm_row_times_head_gives_the_forward_logits(wide):
    ids = [1, 17, 14]
    data = json.loads(
        ok(trace("-c", str(wide), "--ids", ",".join(map(str, ids)), "--position", "1", "--json", "--top", "5"))
    )
    model, _ = load_model(load_config(wide))
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))  # the fast path, no recorder
        from_trace = torch.tensor(data["final_norm"]["row"]) @ model.head.weight.T
    assert torch.allclose(from_trace, logits[0, 1], rtol=0, atol=1e-5)
    expected = torch.topk(logits[0, 1], 5).indices.tolist()
    assert [c["id"] for c in data["next_tokens"]] == expected
    for c in data["next_tokens"]:
        assert abs(c["logit"] - float(logits[0, 1, c["id"]])) < 1e-5


def test_logit_lens_is_final_norm_then_head_of_each_block_output(wide):
    data = json.loads(ok(trace("-c", str(wide), "-p", "ROMEO:", "--json", "--top", "3")))
    model, _ = load_model(load_config(wide))
    norm = model.final_norm
    torch.set_grad_enabled(False)  # restored below
    for block in data["blocks"]:
        row = torch.tensor(block["stages"]["output"])
        scaled = torch.nn.functional.layer_norm(row, (128,), norm.weight, norm.bias, norm.eps)
        probabilities = torch.softmax((scaled @ model.head.weight.T).double(), -1)
        for c in block["logit_lens"]:
            assert abs(c["probability"] - float(probabilities[c["id"]])) < 1e-6
        assert [c["id"] for c in block["logit_lens"]] == torch.topk(probabilities, 3).indices.tolist()
    last, nxt = data["blocks"][-1]["logit_lens"], data["next_tokens"]
    assert [c["id"] for c in last] == [c["id"] for c in nxt]
    assert all(abs(a["probability"] - b["probability"]) < 1e-6 for a, b in zip(last, nxt))
    torch.set_grad_enabled(True)


def test_one_block_shows_the_previous_blocks_output_as_its_input(wide):
    whole = json.loads(ok(trace("-c", str(wide), "-p", "ROMEO:", "--json")))
    one = json.loads(ok(trace("-c", str(wide), "-p", "ROMEO:", "--json", "--block", "2")))
    assert [b["index"] for b in one["blocks"]] == [2]
    assert one["blocks"][0]["input"]["row"] == whole["blocks"][1]["stages"]["output"]
    assert one["blocks"][0]["stages"] == whole["blocks"][2]["stages"]
    text = ok(trace("-c", str(wide), "-p", "ROMEO:", "--block", "-2"))
    assert "block 2 of 4" in text and "block 1 of 4" not in text and "block 3 of 4" not in text
    assert re.search(r"^  input +\[", text, re.M) and "+ position" not in text


def test_post_norm_blocks_are_shown_in_their_own_order(tmp_path):
    config = make_run(tmp_path, context=8, n_layer=2, n_head=2, n_embd=8, ffn_hidden=16, norm_position="post")
    data = json.loads(ok(trace("-c", str(config), "-p", "abc", "--json")))
    assert list(data["blocks"][0]["stages"]) == list(POST_NORM)
    text = ok(trace("-c", str(config), "-p", "abc"))
    labels = [m.group(1) for m in re.finditer(r"^  (\w+) +\[", text, re.M)]
    # block 0 (after token, + position, = input), block 1 (after its input), then the final norm
    assert labels == [*POST_NORM, "input", *POST_NORM, "final_norm"]
    assert "post-norm block: attention = MHA(input);" in text


def test_numbers_have_fixed_decimals_and_no_negative_zero():
    assert number(1.99998, 6) == "1.999980"
    assert number(-0.99998, 6) == "-0.999980"
    assert number(-1e-9, 6) == "0.000000"  # rounds to zero: no sign
    assert number(-0.0, 2) == "0.00"
    assert number(2.5, 0) == "2"


def test_token_text_is_escaped_and_cut():
    assert show_token("\n") == "'\\n'"
    assert show_token(" what") == "' what'"
    assert show_token("x" * 40) == "'" + "x" * 12 + "..."


def test_ranking_only_the_contenders_is_the_head_of_a_stable_sort_of_all():
    """_ranked sorts only the tokens at least as likely as the top-th (for GPT-2's 50,257, once per
    block): the same list as a stable sort of every token, ties (lower id first) included."""
    from minigpt.inspection.trace import _ranked

    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcdefghij"))
    g = torch.Generator().manual_seed(0)
    for logits in (
        torch.tensor([1.0, 3.0, 3.0, 0.5, 3.0, 2.0, 2.0, 0.0, 3.0, 1.0]),  # a four-way tie at the top
        torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]),  # the cut falls inside a tie
        torch.randn(10, generator=g),
        torch.zeros(10),
    ):
        probabilities = torch.softmax(logits.double(), -1)
        everything = torch.sort(probabilities, descending=True, stable=True).indices.tolist()
        for top in (1, 2, 3, 5, 10):
            assert [c.id for c in _ranked(tokenizer, logits, top)] == everything[:top], (logits, top)
