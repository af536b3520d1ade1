"""Direct logit attribution (`trace --attribute`, `run.attribute`): the logit as the sum of what
each part wrote into the residual stream, checked against a plain loop written here from the
weights alone (no Recorder, no trace), exact in float64, within 1e-4 in float32 at GPT-2's shape."""

from __future__ import annotations

import json
import math
from pathlib import Path

import conftest
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from minigpt.api import MinigptError, Run, load
from minigpt.cli import app
from minigpt.config import ModelConfig, load_config
from minigpt.model.gpt import MiniGPT

REPO = Path(__file__).resolve().parents[1]
LESSON = ["-c", str(REPO / "configs" / "lesson09.toml"), "--ids", "0,1,2"]
CHAPTER = ["-c", str(REPO / "configs" / "chapter17.toml"), "--ids", "0,1,2"]


class Characters:
    """A tokenizer for a model built in a test: token i is the text `t{i}`."""

    vocab_size = 50257

    def token_text(self, i: int) -> str:
        return f"t{i}"

    def encode(self, text: str) -> list[int]:
        return [int(piece[1:]) for piece in text.split()]


def reference_parts(model: MiniGPT, ids: list[int], p: int, token: int, versus: int | None) -> dict[str, float]:
    """The parts by a plain loop over the model's weights: each block computed by hand, each
    head's output through its columns of W_O kept apart, the final norm linear at this pass's scale."""
    cfg = model.cfg
    d = cfg.n_embd // cfg.n_head
    with torch.no_grad():
        T = len(ids)
        E, P = model.token_table.weight.double(), model.position_table.weight.double()
        x = E[ids] + P[:T]
        rows = {"token": E[ids[p]], "position": P[p]}
        mask = torch.ones(T, T).tril().bool()
        for i, block in enumerate(model.blocks):
            n1 = F.layer_norm(x, (cfg.n_embd,), block.norm1.weight.double(), _bias(block.norm1), cfg.norm_eps)
            qkv = n1 @ block.attention.qkv.weight.double().T + _bias(block.attention.qkv, 0.0)
            q, k, v = qkv.split(cfg.n_embd, dim=-1)
            W_O = block.attention.out.weight.double()
            attention = torch.zeros_like(x)
            for h in range(cfg.n_head):
                s = slice(h * d, (h + 1) * d)
                scores = (q[:, s] @ k[:, s].T / math.sqrt(d)).masked_fill(~mask, float("-inf"))
                written = torch.softmax(scores, -1) @ v[:, s] @ W_O[:, s].T  # [T, C]
                rows[f"{i}.attention.head{h}"] = written[p]
                attention += written
            if block.attention.out.bias is not None:
                rows[f"{i}.attention.bias"] = block.attention.out.bias.double()
                attention += block.attention.out.bias.double()
            x = x + attention
            n2 = F.layer_norm(x, (cfg.n_embd,), block.norm2.weight.double(), _bias(block.norm2), cfg.norm_eps)
            hidden = F.gelu(n2 @ block.ffn.W1.weight.double().T + _bias(block.ffn.W1, 0.0))
            ffn = hidden @ block.ffn.W2.weight.double().T + _bias(block.ffn.W2, 0.0)
            rows[f"{i}.ffn"] = ffn[p]
            x = x + ffn
        stream = x[p]
        scale = 1 / math.sqrt(float(stream.var(unbiased=False)) + cfg.norm_eps)
        W = model.head.weight.double()
        w = W[token] - (W[versus] if versus is not None else 0)
        gain = model.final_norm.weight.double()
        parts = {name: float(scale * ((row - row.mean()) * gain) @ w) for name, row in rows.items()}
        if model.final_norm.bias is not None:
            parts["final_norm.bias"] = float(model.final_norm.bias.double() @ w)
    return parts


def _bias(module, default=None):
    return module.bias.double() if module.bias is not None else default


def random_run(cfg: ModelConfig, vocab: int, seed: int = 0) -> Run:
    return conftest.random_run(cfg, vocab, Characters(), seed=seed, std=0.3)


def test_the_parts_are_the_plain_loops_and_sum_to_the_logit_in_float64():
    cfg = ModelConfig(n_layer=3, n_head=4, n_embd=16, ffn_hidden=24, context=8, activation="gelu", dtype="float64")
    run = random_run(cfg, 50)
    ids = [3, 1, 4, 1, 5, 9]
    for position, token, versus in [(5, 7, None), (2, 11, 13), (0, 4, 40)]:
        result = run.attribute(ids=ids, position=position, answer=token, versus=versus)
        expected = reference_parts(run.model, ids, position, token, versus)
        assert [part.name for part in result.parts] == list(expected)
        for part in result.parts:
            assert part.value == pytest.approx(expected[part.name], abs=1e-12), part.name
        with torch.no_grad():  # the model's plain pass (the fused attention kernel: equal up to rounding)
            logits = run.model(torch.tensor([ids]))[0][0, position].double()
        total = float(logits[token] - (logits[versus] if versus is not None else 0))
        assert result.total == pytest.approx(total, abs=1e-12)
        assert abs(math.fsum(part.value for part in result.parts) - total) < 1e-12
        assert abs(result.error) < 1e-12


def test_the_parts_sum_to_the_logit_within_1e_4_in_float32_at_gpt2_shape():
    cfg = ModelConfig(n_layer=12, n_head=12, n_embd=768, ffn_hidden=3072, context=32, activation="gelu_tanh")
    torch.manual_seed(0)
    model = MiniGPT(cfg, 50257).eval()  # GPT-2's own initialisation
    run = Run(Path("gpt2-shape"), load_config(REPO / "configs" / "default.toml"), model, Characters())
    ids = torch.randint(0, 50257, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    result = run.attribute(ids=ids, answer=262, versus=257)
    assert len(result.parts) == 2 + 12 * (12 + 2) + 1  # token, position; heads, bias, ffn per block; final bias
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0][0, -1]
    assert result.total == pytest.approx(float(logits[262] - logits[257]), abs=1e-5)
    assert abs(math.fsum(part.value for part in result.parts) - result.total) < 1e-4


def test_the_lessons_parts_sum_to_the_logit_of_its_rmsnorm_block():
    run = load(None, config=REPO / "configs" / "lesson09.toml")
    result = run.attribute(ids=[0, 1, 2], answer="b", versus="c")
    assert [part.name for part in result.parts] == [
        "token",
        "position",
        "0.attention.head0",
        "0.attention.head1",
        "0.ffn",
    ]
    assert abs(result.error) < 1e-12
    # RMSNorm has no centring: the token row's part is its row through the scale and the head's rows
    E = run.model.token_table.weight.detach().double()
    row = E[2]  # token 'c' at position 2; the head is tied to the token table
    assert result.parts[0].value == pytest.approx(float(result.scale * row @ (E[1] - E[2])), abs=1e-12)


def test_an_ablated_head_is_a_zero_part_and_a_scaled_attention_scales_its_parts():
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=8, ffn_hidden=16, context=8, dtype="float64")
    run = random_run(cfg, 20, seed=3)
    plain = run.attribute(ids=[1, 2, 3], answer=5)
    ablated = run.attribute(ids=[1, 2, 3], answer=5, ablate_head=["1.0"])
    assert {p.name: p.value for p in ablated.parts}["1.attention.head0"] == 0.0
    assert abs(ablated.error) < 1e-12
    halved = run.attribute(ids=[1, 2, 3], answer=5, scale={"1.attention": 0.5})
    assert abs(halved.error) < 1e-12
    # the last block's heads read what they read before; their parts are halved, through the new scale
    before, after = {p.name: p.value for p in plain.parts}, {p.name: p.value for p in halved.parts}
    for h in range(2):
        name = f"1.attention.head{h}"
        assert after[name] / halved.scale == pytest.approx(0.5 * before[name] / plain.scale, rel=1e-12)
    replaced = run.attribute(ids=[1, 2, 3], answer=5, set_input=[0.5] * 8)
    assert replaced.parts[0].name == "input" and abs(replaced.error) < 1e-12


def test_a_post_norm_model_is_refused_saying_why():
    run = random_run(ModelConfig(n_layer=1, n_head=2, n_embd=8, ffn_hidden=16, context=8, norm_position="post"), 20)
    with pytest.raises(MinigptError, match=r"post-norm \(\[model\] norm_position = post\).*not a sum") as refusal:
        run.attribute(ids=[1, 2], answer=3)
    assert "\n" not in str(refusal.value)
    with pytest.raises(MinigptError, match="post-norm"):
        run.patch("t1 t2", "t1 t3", 4, 5)


def test_trace_attribute_prints_bars_that_fit_80_columns_and_the_json_carries_the_parts():
    result = CliRunner().invoke(app, ["trace", *LESSON, "--attribute", "b", "--versus", "c"])
    assert result.exit_code == 0, result.stderr
    text = result.stdout[result.stdout.index("attribution:") :]
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    assert "0.attention.head1" in text and "sum of the parts -7.4277" in text
    data = json.loads(CliRunner().invoke(app, ["trace", *LESSON, "--attribute", "b", "--versus", "c", "--json"]).stdout)
    attribution = data["attribution"]
    assert attribution["token"] == "b" and attribution["versus"] == "c" and attribution["id"] == 1
    assert math.fsum(p["value"] for p in attribution["parts"]) == pytest.approx(attribution["total"], abs=1e-12)
    assert data["next_tokens"]  # beside the trace, not instead of it


def test_attribute_by_id_and_with_compare_gives_both_passes():
    result = CliRunner().invoke(
        app, ["trace", *CHAPTER, "--attribute", "#1", "--scale", "0.attention=0", "--compare", "--json"]
    )
    data = json.loads(result.stdout)
    before, after = data["before"]["attribution"], data["after"]["attribution"]
    assert before["id"] == after["id"] == 1
    heads_after = [p["value"] for p in after["parts"] if ".attention." in p["name"]]
    assert heads_after and all(v == 0.0 for v in heads_after)
    text = CliRunner().invoke(app, ["trace", *CHAPTER, "--attribute", "#1", "--scale", "0.attention=0", "--compare"])
    assert (
        "before" in text.stdout
        and "change" in text.stdout
        and all(len(line) <= 80 for line in text.stdout.splitlines())
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--attribute", "ab"], "--attribute 'ab' encodes to 2 tokens ('a' (#0), 'b' (#1))"),
        (["--attribute", "#9"], "--attribute '#9': this model has 4 tokens, ids 0..3"),
        (["--attribute", "#x"], "'x' is not a token id"),
        (["--attribute", "b", "--versus", "#1"], "--attribute and --versus are the same token ('b')"),
        (["--versus", "b"], "--versus is the token an attribution compares with; give --attribute TOKEN too"),
        (["--attribute", "b", "--replace-residual", "0"], "attribution with --replace-residual"),
    ],
)
def test_a_token_that_cannot_be_attributed_is_refused_in_one_line(args, message):
    result = CliRunner().invoke(app, ["trace", *LESSON, *args])
    assert result.exit_code == 2 and result.stdout == ""
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_the_api_names_its_own_arguments_in_refusals():
    run = load(None, config=REPO / "configs" / "lesson09.toml")
    with pytest.raises(Exception, match=r"answer 'ab' encodes to 2 tokens"):
        run.attribute(ids=[0, 1], answer="ab")
    with pytest.raises(Exception, match=r"answer and versus are the same token"):
        run.attribute(ids=[0, 1], answer=1, versus="b")
