"""`trace --grad` (inspection/gradients.py): the gradient of the traced position's next-token loss
with respect to every stage's row, from the graph of the traced pass itself. Checked, in float64
and for every [model] switch, against two computations of its own: torch.autograd on a second pass
that adds a zero shift to one stage's row (a plain Recorder replacement, no kept graph), and
central finite differences of the loss as that row moves; and the training log's
`block_grad_norms` against a manual backward of the first batch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import Numbered, random_run, train_tiny_run
from typer.testing import CliRunner

from minigpt.api import MinigptError
from minigpt.cli import app
from minigpt.config import ModelConfig, load_config
from minigpt.explore.explorer import Explorer
from minigpt.inspection.interventions import parse
from minigpt.inspection.interventions_apply import replacements
from minigpt.model import stages
from minigpt.model.recorder import Recorder

REPO = Path(__file__).resolve().parents[1]
LESSON = ["-c", str(REPO / "configs" / "lesson09.toml"), "--ids", "0,1,2"]
IDS = [3, 1, 4, 1, 5]
SWITCHES = {
    "layernorm": {},
    "no residual": {"residual": False},
    "no norm": {"norm": "none"},
    "no ffn": {"ffn_hidden": 0},
    "no positions": {"positions": "none"},
    "post-norm": {"norm_position": "post"},
    "post-norm, no ffn": {"norm_position": "post", "ffn_hidden": 0},
    "rmsnorm, swiglu, tied": {"norm": "rmsnorm", "activation": "swiglu", "tie_embeddings": True},
}


def model_run(dtype: str = "float64", **switches):
    shape = {"n_layer": 2, "n_head": 2, "n_embd": 8, "ffn_hidden": 16, "context": 8}
    cfg = ModelConfig(**{**shape, "dtype": dtype, **switches})
    return random_run(cfg, 12, Numbered(), seed=1, std=0.4)


def rows_by_stage(gradient) -> dict[str, list[float]]:
    """The gradient's rows by the full stage names the pass records them under."""
    rows = {stages.INPUT: gradient.input.row, stages.FINAL_NORM: gradient.final_norm.row}
    for block in gradient.blocks:
        rows.update({stages.block_name(block.index, name): g.row for name, g in block.stages.items()})
    return rows


def shifted_loss(model, ids, position, target, name, shift, changes=None) -> torch.Tensor:
    """The target's loss at `position` from a pass of its own, with `shift` added to stage `name`'s
    row there by a Recorder replacement (after `changes`' own replacement of it, if any)."""
    changes = dict(changes or {})
    first = changes.get(name)

    def add(value, recorded):
        value = value if first is None else first(value, recorded)
        at = (torch.arange(value.shape[1]) == position).to(value.dtype).view(1, -1, 1)
        return value + at * shift

    changes[name] = add
    logits, _ = model(torch.tensor([ids]), recorder=Recorder(model.cfg, changes))
    return F.cross_entropy(logits[0, position].unsqueeze(0), torch.tensor([target]))


def autograd_row(model, ids, position, target, name, width, changes=None) -> torch.Tensor:
    shift = torch.zeros(width, dtype=model.token_table.weight.dtype, requires_grad=True)
    return torch.autograd.grad(shifted_loss(model, ids, position, target, name, shift, changes), shift)[0]


def finite_row(model, ids, position, target, name, width, changes=None, eps=1e-6) -> list[float]:
    row = []
    with torch.no_grad():
        for j in range(width):
            step = torch.zeros(width, dtype=torch.float64)
            step[j] = eps
            up = shifted_loss(model, ids, position, target, name, step, changes)
            down = shifted_loss(model, ids, position, target, name, -step, changes)
            row.append(float(up - down) / (2 * eps))
    return row


@pytest.mark.parametrize("switches", SWITCHES.values(), ids=SWITCHES.keys())
def test_every_stages_gradient_is_autograds_of_a_shifted_pass_and_the_finite_differences(switches):
    run = model_run(**switches)
    model, position = run.model, 2
    traced = run.trace(ids=IDS, position=position, grad=True)
    gradient = traced.gradient
    assert (gradient.target_id, gradient.target_from) == (IDS[position + 1], "prompt")
    logits = traced.stage(None, stages.LOGITS)
    assert gradient.loss == pytest.approx(-float(torch.log_softmax(logits, -1)[IDS[position + 1]]), abs=1e-13)
    rows = rows_by_stage(gradient)
    # every row stage the model computes (a removed one is absent), and nothing else
    expected = [n for n in stages.recorded_names(2, **stages.of(model.cfg)) if n.rsplit(".", 1)[-1] in RECORDED_ROWS]
    assert sorted(rows) == sorted(expected)
    for name, row in rows.items():
        torch.testing.assert_close(
            torch.tensor(row, dtype=torch.float64),
            autograd_row(model, IDS, position, IDS[position + 1], name, len(row)),
            rtol=0,
            atol=1e-12,
        )
        fd = finite_row(model, IDS, position, IDS[position + 1], name, len(row))
        assert max(abs(a - b) for a, b in zip(row, fd)) < 1e-8, name
    for grad in all_gradients(gradient):
        assert grad.norm == pytest.approx(math.sqrt(math.fsum(v * v for v in grad.row)), rel=1e-14)
    # what enters block 1 is block 0's output, one value
    assert gradient.blocks[1].input.row == rows[stages.block_name(0, stages.OUTPUT)]
    assert gradient.blocks[0].input.row == gradient.input.row


RECORDED_ROWS = {stages.INPUT, stages.FINAL_NORM, *stages.PRE_NORM, *stages.POST_NORM}


def all_gradients(gradient):
    yield gradient.input
    yield gradient.final_norm
    for block in gradient.blocks:
        yield block.input
        yield from block.stages.values()


def test_without_a_norm_norm1_is_read_by_attention_alone_not_the_residual():
    # norm = "none": norm1 holds the input's very values, but a change of norm1 reaches attention
    # only, while the input also flows past the block through the skip connection
    gradient = model_run(norm="none").trace(ids=IDS, position=1, grad=True).gradient
    block = gradient.blocks[0]
    assert block.stages[stages.NORM1].row != block.input.row
    without_skip = [a - b for a, b in zip(block.input.row, block.stages[stages.RESIDUAL1].row)]
    assert max(abs(a - b) for a, b in zip(without_skip, block.stages[stages.NORM1].row)) < 1e-12


def test_at_the_last_position_the_target_is_the_models_top_prediction_or_the_one_asked_for():
    run = model_run()
    traced = run.trace(ids=IDS, grad=True)
    assert traced.gradient.target_from == "prediction"
    assert traced.gradient.target_id == traced.next_tokens[0].id
    assert traced.gradient.loss == pytest.approx(-math.log(traced.next_tokens[0].probability), abs=1e-12)
    asked = run.trace(ids=IDS, grad=True, target="t7").gradient
    assert (asked.target_id, asked.target_from, asked.target) == (7, "given", "t7")
    row = rows_by_stage(asked)[stages.INPUT]
    torch.testing.assert_close(
        torch.tensor(row, dtype=torch.float64), autograd_row(run.model, IDS, 4, 7, stages.INPUT, 8), rtol=0, atol=1e-12
    )
    assert run.trace(ids=IDS, grad=True, target=7).gradient.input.row == row  # an id, as attribute takes one


@pytest.mark.parametrize(
    "edits",
    [
        {"replace_residual": ["all"]},
        {"scale": ["0.attention=0.5", "1.ffn=0"]},
        {"ablate_head": ["1.0"], "set_input": "0.5,-0.25,1,0,0.3,-1,0.2,0.7"},
    ],
    ids=["replace-residual", "scale", "ablate and set-input"],
)
def test_with_interventions_the_modified_pass_is_the_one_differentiated(edits):
    run, position = model_run(), 2
    target = IDS[position + 1]
    compared = run.trace(ids=IDS, position=position, grad=True, **edits)
    changes = replacements(parse(**edits), run.model, position)
    for name, row in rows_by_stage(compared.after.gradient).items():
        fd = finite_row(run.model, IDS, position, target, name, len(row), changes)
        assert max(abs(a - b) for a, b in zip(row, fd)) < 1e-8, name
    plain = run.trace(ids=IDS, position=position, grad=True)
    assert compared.before.gradient == plain.gradient


def test_both_passes_of_a_comparison_differentiate_the_unmodified_passs_prediction():
    run = model_run()
    compared = run.trace(ids=IDS, grad=True, scale=["all.attention=0"])
    before, after = compared.before.gradient, compared.after.gradient
    assert before.target_from == after.target_from == "prediction"
    assert after.target_id == before.target_id == compared.before.next_tokens[0].id
    assert after.loss == pytest.approx(-math.log(compared.after.probabilities[before.target_id]), abs=1e-12)
    assert after.blocks[0].stages[stages.ATTENTION].norm > 0  # d loss / d attention is not zero...
    assert after.blocks[0].stages[stages.NORM1].norm == 0  # ...but it no longer reaches what attention read


def test_a_float32_model_in_training_mode_is_differentiated_in_float32_in_eval_mode_leaving_no_trace():
    run = model_run(dtype="float32", dropout=0.5)
    model = run.model.train()
    first = run.trace(ids=IDS, position=1, grad=True).gradient
    assert model.training and all(p.grad is None for p in model.parameters())
    second = run.trace(ids=IDS, position=1, grad=True).gradient
    assert first == second  # no dropout drawn
    model.eval()
    for name, row in rows_by_stage(first).items():
        reference = autograd_row(model, IDS, 1, IDS[2], name, len(row))
        assert reference.dtype == torch.float32
        torch.testing.assert_close(torch.tensor(row, dtype=torch.float32), reference, rtol=1e-5, atol=1e-6)


def test_a_model_whose_parameters_are_frozen_is_differentiated_all_the_same():
    run = model_run()
    expected = run.trace(ids=IDS, position=2, grad=True).gradient
    for parameter in run.model.parameters():
        parameter.requires_grad_(False)
    assert run.trace(ids=IDS, position=2, grad=True).gradient == expected


def test_one_block_shown_carries_that_blocks_gradient():
    run = model_run()
    whole = run.trace(ids=IDS, position=2, grad=True).gradient
    one = run.trace(ids=IDS, position=2, grad=True, block=-1).gradient
    assert [b.index for b in one.blocks] == [1] and one.blocks[0] == whole.blocks[1]


def test_a_target_without_grad_or_not_one_token_is_refused():
    run = model_run()
    with pytest.raises(
        MinigptError, match=r"^target is the token whose loss a gradient differentiates; give grad=True"
    ):
        run.trace(ids=IDS, target="t1")
    with pytest.raises(MinigptError, match=r"^target '#12': this model has 12 tokens"):
        run.trace(ids=IDS, grad=True, target="#12")


# ---------------------------------------------------------------- the command line and the page


def test_trace_grad_prints_each_stages_norm_beside_it_and_the_json_has_the_rows():
    runner = CliRunner()
    text = runner.invoke(app, ["trace", *LESSON, "--position", "1", "--grad"])
    assert text.exit_code == 0, text.output
    shown = runner.invoke(app, ["trace", *LESSON, "--position", "1", "--grad", "--json"])
    data = json.loads(shown.stdout)
    gradient = data["gradient"]
    assert (gradient["target"], gradient["target_id"], gradient["target_from"]) == ("c", 2, "prompt")
    lines = text.stdout.splitlines()
    assert "loss = -log p('c') = " + f"{gradient['loss']:.4f} nats at position 1;" in text.stdout
    block = gradient["blocks"][0]
    for name, grad in block["stages"].items():
        line = next(line for line in lines if line.startswith(f"  {name} ") and "[1, 3, " in line)
        assert line.endswith(f"  {grad['norm']:.4f}"), line
        assert len(grad["row"]) == len(data["blocks"][0]["stages"][name])
    assert next(line for line in lines if line.startswith("  = input")).endswith(f"{block['input']['norm']:.4f}")
    assert next(line for line in lines if line.startswith("  token 'b'")).endswith("[4, 4]")  # no norm of its own
    assert next(line for line in lines if line.startswith("  final_norm")).endswith(
        f"{gradient['final_norm']['norm']:.4f}"
    )
    assert all(len(line) <= 80 for line in lines)
    plain = json.loads(runner.invoke(app, ["trace", *LESSON, "--json"]).stdout)
    assert "gradient" not in plain and "|grad|" not in runner.invoke(app, ["trace", *LESSON]).stdout


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--grad", "--target", "ab"], "minigpt: error: --target 'ab' encodes to 2 tokens"),
        (["--grad", "--target", "#99"], "minigpt: error: --target '#99': this model has 4 tokens, ids 0..3"),
        (["--target", "b"], "minigpt: error: --target is the token whose loss a gradient differentiates; give --grad"),
    ],
)
def test_a_bad_target_is_refused_in_one_line(flags, message):
    result = CliRunner().invoke(app, ["trace", *LESSON, *flags])
    assert result.exit_code == 2 and result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_trace_grad_compare_shows_both_passes_norms():
    result = CliRunner().invoke(app, ["trace", *LESSON, "--replace-residual", "0", "--compare", "--grad"])
    assert result.exit_code == 0, result.output
    data = json.loads(
        CliRunner().invoke(app, ["trace", *LESSON, "--replace-residual", "0", "--compare", "--grad", "--json"]).stdout
    )
    before, after = data["before"]["gradient"], data["after"]["gradient"]
    assert before["target_from"] == after["target_from"] == "prediction"
    lines = result.stdout.splitlines()
    start = lines.index("block 0: |grad| before and after")
    assert lines[start + 1].split() == ["stage", "before", "after"]
    shown = {line.split()[0]: line.split()[1:] for line in lines[start + 2 : start + 10]}
    assert shown["input"] == [
        f"{before['blocks'][0]['input']['norm']:.4f}",
        f"{after['blocks'][0]['input']['norm']:.4f}",
    ]
    assert shown["output"] == [
        f"{before['blocks'][0]['stages']['output']['norm']:.4f}",
        f"{after['blocks'][0]['stages']['output']['norm']:.4f}",
    ]


def test_the_trace_guide_shows_trace_grads_real_output(monkeypatch):
    command = "minigpt trace -c configs/lesson09.toml --ids 0,1,2 --position 1 --grad"
    guide = (REPO / "docs" / "guide" / "trace.md").read_text(encoding="utf-8")
    shown = guide.split(f"$ {command}\n", 1)[1].split("```", 1)[0].rstrip("\n").removesuffix("\n...")
    shown = shown.split("\n...\n")
    monkeypatch.chdir(REPO)
    printed = CliRunner().invoke(app, command.split()[1:]).stdout
    for part in shown:
        assert part in printed, part


def test_the_explore_page_is_answered_run_traces_gradient(tmp_path):
    explorer = Explorer(model_run())
    answer = explorer.trace({"prompt": "t3 t1 t4", "position": 1, "grad": True})
    assert answer["gradient"] == explorer.run.trace("t3 t1 t4", position=1, grad=True).as_dict()["gradient"]
    compared = explorer.trace({"prompt": "t3 t1 t4", "grad": True, "target": "t2", "scale": ["0.ffn=0"]})
    assert compared["after"]["gradient"]["target_id"] == compared["before"]["gradient"]["target_id"] == 2
    assert "gradient" not in explorer.trace({"prompt": "t3 t1 t4"})
    with pytest.raises(MinigptError, match=r"^grad 'yes' must be true or false"):
        explorer.trace({"prompt": "t3", "grad": "yes"})


# ---------------------------------------------------------------- training: each block's gradient norm


def test_the_log_has_each_blocks_gradient_norm_of_the_step_before_clipping(tmp_path, monkeypatch):
    from minigpt.text.corpus import load_corpus
    from minigpt.training import trainer
    from minigpt.training.session import build

    measured = []
    real = trainer.block_grad_norms
    monkeypatch.setattr(trainer, "block_grad_norms", lambda model: measured.append(1) or real(model))
    settings = ["model.n_layer=3", "train.log_interval=3", "train.steps=7", "train.grad_accum=2"]
    settings += ["train.grad_clip=0.001", 'train.precision="float32"']
    run = train_tiny_run(tmp_path, *[item for setting in settings for item in ("--set", setting)])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "loss" in r and not r.get("eval")]
    assert [r["step"] for r in logged] == [3, 6, 7] and len(measured) == 3  # measured on logged steps only
    assert all(len(r["block_grad_norms"]) == 3 for r in logged)

    # Step 1 again, by hand: the same seeded model and batches, two micro-batches, each block's
    # norm a plain sum of squares; logged every step this time.
    settings[1:3] = ["train.log_interval=1", "train.steps=2"]
    (tmp_path / "again").mkdir()
    again = train_tiny_run(tmp_path / "again", *[item for setting in settings for item in ("--set", setting)])
    first = json.loads((again / "metrics.jsonl").read_text().splitlines()[0])
    cfg = load_config(tmp_path / "again" / "tiny.toml", settings)
    session = build(cfg, load_corpus(cfg))
    for _ in range(2):
        x, y = session.train_batches.sample(session.generator)
        (session.model(x, y)[1] / 2).backward()
    by_hand = [
        math.sqrt(math.fsum(float(v) ** 2 for p in block.parameters() for v in p.grad.flatten().tolist()))
        for block in session.model.blocks
    ]
    assert first["step"] == 1 and first["block_grad_norms"] == pytest.approx(by_hand, rel=1e-5)
    assert min(by_hand) > 0.01  # far above the clip: the norms are the unclipped gradient's
