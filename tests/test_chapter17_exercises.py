"""Chapter 17's six exercises (17.8), each checked by a command on the chapter's own weights
(configs/chapter17.toml, data/chapter17/; data/chapter17-post/ for exercise 6), against the
reference answers (17.9) to the digits shown, plus --all-positions (the full matrix Y) and each
refusal: one line on stderr, exit 2, no traceback.

    1  --set-row token_table.a=2,1 --ids 0,0 --all-positions   the block inputs [2,1] and [2,2]
    2  --feed 0.norm1=2,4 / =20,20                              mean 3, variance 1, [-0.999995, 0.999995]; [0, 0]
    3  --norm-over positions --compare-ids                      a later token changes position 0's norm1
    4  --feed 0.ffn=1,-1 / =-1,1               [1,-2,-1] -> [1,0,0] -> [1,0]; [-1,2,1] -> [0,2,1] -> [1,1]
    5  --broadcast-update 0.attention                           the residual add refuses [1, 3, 2] + [1, 1, 2]
    6  --compare-run data/chapter17-post                        attention reads X vs LN(X); the output is normalised
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from pathlib import Path

import pytest
import reference  # tests/ is on sys.path under `pytest` and `python -m pytest` alike
import torch

import minigpt
from minigpt.errors import MinigptError
from minigpt.model import stages
from minigpt.model.recorder import Recorder

REPO = Path(__file__).resolve().parents[1]
CHAPTER_CONFIG = REPO / "configs" / "chapter17.toml"
CHAPTER_RUN = REPO / "data" / "chapter17"
POST_RUN = REPO / "data" / "chapter17-post"
Y_ROWS = ["[1.999980, 2.999940]", "[0.999912, 1.476742]", "[2.999964, 3.746396]"]


@pytest.fixture
def chapter(cli):
    """`minigpt trace -c configs/chapter17.toml ARGS`, in-process."""

    def invoke(*args):
        return cli("trace", "-c", CHAPTER_CONFIG, *args)

    return invoke


def ok(result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.stderr, result.exception)
    return result.stdout


def refused(result) -> str:
    """The one line a refusal prints: exit 2, nothing on stdout, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.exception)
    assert result.stdout == "" and "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("minigpt: error: ")
    return line


def lines_starting(text: str, name: str) -> list[str]:
    """The table lines of a fed part's step `name`, stripped."""
    return [line.strip() for line in text.splitlines() if line.startswith(f"  {name} ")]


# ------------------------------------------------------------------ exercise 1: a set table row


def test_exercise_1_a_row_of_E_set_on_the_command_line_gives_the_two_block_inputs(chapter):
    out = ok(chapter("--ids", "0,0", "--set-row", "token_table.a=2,1", "--all-positions", "--digits", "6"))
    # the header names the intervention
    assert "interventions (the rows below are the modified pass): set-row token_table.a=2,1" in out.splitlines()
    text = "\n".join(out.splitlines())
    assert "  token       0 'a'     [2.000000, 1.000000]            [3, 2]" in text
    assert "              1 'a'     [2.000000, 1.000000]" in text
    assert "  + position  0 'a'     [0.000000, 0.000000]            [3, 2]" in text
    assert "              1 'a'     [0.000000, 1.000000]" in text
    assert "  = input     0 'a'     [2.000000, 1.000000]            [1, 2, 2]" in text
    assert "              1 'a'     [2.000000, 2.000000]" in text
    data = json.loads(ok(chapter("--ids", "0,0", "--set-row", "token_table.#0=2,1", "--all-positions", "--json")))
    assert data["all_positions"]["input"] == [[2.0, 1.0], [2.0, 2.0]]
    assert data["interventions"] == ["set-row token_table.#0=2,1"]


def test_a_set_row_is_made_in_a_copy_and_the_run_keeps_its_own_weights(chapter):
    before = hashlib.sha256((CHAPTER_RUN / "checkpoint.pt").read_bytes()).hexdigest()
    run = minigpt.load(config=CHAPTER_CONFIG)
    row = run.model.token_table.weight[0].tolist()
    edited = run.trace(
        ids=[0, 1], position=0, set_row={"token_table.a": [5, 5], "position_table.1": [1, 1]}, compare=False
    )
    assert edited.input.token_row == [5.0, 5.0] and edited.whole(None, "input")[1].tolist() == [1.0, 2.0]
    assert run.model.token_table.weight[0].tolist() == row == [1.0, 0.0]  # the loaded run is untouched
    assert run.trace(ids=[0, 1], position=0).input.token_row == [1.0, 0.0]
    assert hashlib.sha256((CHAPTER_RUN / "checkpoint.pt").read_bytes()).hexdigest() == before


def test_a_set_row_compared_shows_what_follows_from_it(chapter):
    data = json.loads(ok(chapter("--ids", "0", "--set-row", "token_table.a=2,1", "--compare", "--json")))
    assert data["stages"][0]["input"]["before"] == [1.0, 0.0] and data["stages"][0]["input"]["after"] == [2.0, 1.0]


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "tokens.a=2,1",
            "--set-row 'tokens.a=2,1': unknown table 'tokens'; set a row of token_table or position_table",
        ),
        ("token_table.a=2", "--set-row token_table.a=2: 1 numbers but the model's width is 2; give exactly 2"),
        ("token_table.#3=2,1", "--set-row token_table.#3=2,1 '#3': this model has 3 tokens, ids 0..2"),
        ("token_table.ab=2,1", "--set-row token_table.ab=2,1 'ab' encodes to 2 tokens ('a' (#0), 'b' (#1))"),
        ("token_table.z=2,1", "--set-row token_table.z=2,1: text has 1 character(s) the char tokenizer never saw"),
        ("position_table.3=2,1", "--set-row position_table.3=2,1: position_table has rows 0..2 ([model] context = 3)"),
        ("token_table.a=2,x", "--set-row token_table.a=2,x: 'x' is not a number"),
        ("token_table.a=inf,1", "--set-row token_table.a=inf,1: every number must be finite"),
        ("token_table=2,1", "--set-row 'token_table=2,1': expected TABLE.ROW=NUMBERS"),
    ],
)
def test_a_row_of_an_unknown_table_or_token_or_width_is_refused_in_one_line(chapter, value, message):
    assert refused(chapter("--ids", "0,1", "--set-row", value)).startswith("minigpt: error: " + message)


def test_set_input_shows_the_input_as_replaced_not_as_a_sum_that_was_never_added(chapter):
    out = ok(chapter("--ids", "0,1,2", "--set-input", "2,4"))
    assert "  input (set)  [2.0000, 4.0000]          [1, 3, 2]" in out.splitlines()
    assert "  token 'c'" not in out and "  + position 2" not in out  # the rows that were not used
    data = json.loads(ok(chapter("--ids", "0,1,2", "--set-input", "2,4", "--json")))
    assert data["input"]["replaced"] is True and data["input"]["row"] == [2.0, 4.0]
    assert "replaced" not in json.loads(ok(chapter("--ids", "0,1,2", "--json")))["input"]


# ------------------------------------------------------------------ exercises 2 and 4: one part fed


def test_exercise_2_the_first_norm_fed_2_4_and_20_20_shows_every_step(chapter):
    out = ok(chapter("--feed", "0.norm1=2,4", "--feed", "0.norm1=20,20", "--digits", "6"))
    first, second = out.split("\n\n")
    assert first.splitlines()[1:] == [
        "  x                                      [2.000000, 4.000000]",
        "  mean = sum(x) / 2                      3.000000",
        "  variance = sum((x - mean)^2) / 2       1.000000",
        "  denominator = sqrt(variance + eps)     1.000005",
        "  normalised = (x - mean) / denominator  [-0.999995, 0.999995]",
        "  gamma                                  [1.000000, 1.000000]",
        "  beta                                   [0.000000, 0.000000]",
        "  norm1 = gamma * normalised + beta      [-0.999995, 0.999995]",
        "mean, variance, denominator, normalised: chapter 17.3's formula, worked from the",
        "module's parameters; norm1: the module's output, which the formula gives too",
    ]
    assert first.splitlines()[0] == "block 0's norm1 (LayerNorm, eps 1e-05), the model's own module, on x = [2, 4]"
    assert lines_starting(second, "variance") == ["variance = sum((x - mean)^2) / 2       0.000000"]
    assert lines_starting(second, "norm1") == ["norm1 = gamma * normalised + beta      [0.000000, 0.000000]"]
    [fed] = json.loads(ok(chapter("--feed", "0.norm1=2,4", "--json")))
    steps = {step["name"]: step for step in fed["steps"]}
    assert steps["mean"]["value"] == 3.0 and steps["variance"]["value"] == 1.0
    assert steps["denominator"]["value"] == math.sqrt(1.00001)
    assert fed["output"] == pytest.approx([-1 / math.sqrt(1.00001), 1 / math.sqrt(1.00001)], abs=1e-15)
    assert fed["agrees"] is True and steps["norm1"]["computed_by"] == "module"


def test_exercise_4_the_ffn_fed_both_rows_shows_the_values_before_and_after_relu(chapter):
    out = ok(chapter("--feed", "0.ffn=1,-1", "--feed", "0.ffn=-1,1", "--digits", "6"))
    first, second = out.split("\n\n")
    assert first.splitlines() == [
        "block 0's ffn (2 -> 3 -> 2), the model's own module, on x = [1, -1]",
        "  x                              [1.000000, -1.000000]",
        "  pre_activation = x W1 + b1     [1.000000, -2.000000, -1.000000]",
        "  hidden = relu(pre_activation)  [1.000000, 0.000000, 0.000000]",
        "  ffn = hidden W2 + b2           [1.000000, 0.000000]",
        "pre_activation, hidden, ffn: recorded inside the model's ffn module as it ran",
    ]
    assert lines_starting(second, "pre_activation") == [
        "pre_activation = x W1 + b1     [-1.000000, 2.000000, 1.000000]"
    ]
    assert lines_starting(second, "hidden") == ["hidden = relu(pre_activation)  [0.000000, 2.000000, 1.000000]"]
    assert lines_starting(second, "ffn") == ["ffn = hidden W2 + b2           [1.000000, 1.000000]"]


def test_a_fed_part_is_the_models_own_module_called_once(chapter):
    run = minigpt.load(config=CHAPTER_CONFIG)
    calls = []
    for name in ("ffn", "norm1"):
        getattr(run.model.blocks[0], name).register_forward_hook(lambda m, i, o, name=name: calls.append(name))
    fed = run.feed("0.ffn", [1, -1])
    assert calls == ["ffn"] and fed.output == [1.0, 0.0]
    # the row kept before the activation is the module's own: replace W1 and it follows
    with torch.no_grad():
        run.model.blocks[0].ffn.W1.bias.fill_(1.0)
    assert [step.value for step in run.feed("0.ffn", "1,-1").steps][1] == [2.0, -1.0, 0.0]
    run.feed("0.norm1", [2, 4])
    assert calls == ["ffn", "ffn", "norm1"]


def test_pre_activation_is_replaceable_but_not_a_row_of_the_trace(chapter):
    run = minigpt.load(config=CHAPTER_CONFIG)
    name = stages.block_name(0, stages.PRE_ACTIVATION)
    recorder = Recorder(run.model.cfg, {name: lambda value, recorded: value * 0})
    with torch.no_grad():
        run.model(torch.tensor([[0, 1, 2]]), recorder=recorder)
    assert name not in recorder.stages  # replaceable, not recorded: the trace's table stays the chapter's
    assert recorder[stages.block_name(0, stages.HIDDEN)].abs().max() == 0


@pytest.mark.parametrize(
    "value, message",
    [
        ("0.ffn", "--feed '0.ffn': expected PART=NUMBERS, e.g. --feed 0.ffn=1,-1"),
        ("0.attention=1,1", "--feed 0.attention: not a part that takes one row; feed B.norm1, B.norm2, B.ffn"),
        ("1.ffn=1,1", "--feed 1.ffn: block '1' does not exist; the model has 1 block(s), 0..0"),
        ("0.ffn=1", "--feed 0.ffn: 1 numbers but the model's width is 2; give exactly 2 comma-separated numbers"),
        ("0.norm1=1,x", "--feed 0.norm1=1,x: 'x' is not a number"),
    ],
)
def test_a_feed_of_an_unknown_part_or_width_is_refused_in_one_line(chapter, value, message):
    assert refused(chapter("--feed", value)).startswith("minigpt: error: " + message)


def test_a_feed_takes_no_prompt(chapter):
    assert refused(chapter("--feed", "0.ffn=1,1", "--ids", "0")) == (
        "minigpt: error: --feed runs one part on the numbers given, with no prompt and no pass to trace; leave "
        "out --ids, or trace without --feed"
    )


# ------------------------------------------------------------------ exercise 3: a norm over positions


def _norm_over_positions(rows: list[list[float]], eps: float = 1e-5) -> list[list[float]]:
    """Each coordinate normalised over the positions, in scalars (gamma 1, beta 0)."""
    out = [[0.0] * len(rows[0]) for _ in rows]
    for c in range(len(rows[0])):
        column = [row[c] for row in rows]
        mean = math.fsum(column) / len(column)
        variance = math.fsum((v - mean) ** 2 for v in column) / len(column)
        for t, v in enumerate(column):
            out[t][c] = (v - mean) / math.sqrt(variance + eps)
    return out


def test_exercise_3_a_norm_over_positions_lets_a_later_token_change_an_earlier_row(chapter):
    args = ("--ids", "0,1,1", "--position", "0", "--compare-ids", "0,1,2", "--json")
    broken = json.loads(ok(chapter(*args, "--norm-over", "positions")))
    assert broken["interventions"] == ["norm-over positions"] and broken["compared_ids"] == [0, 1, 2]
    norm1 = broken["stages"][0]["norm1"]
    assert broken["stages"][0]["input"]["change"] == 0  # position 0's own input is the same
    # X = E + P for 'a' 'b' 'c' and 'a' 'b' 'b': only position 2 differs, yet position 0's norm1 does too
    assert norm1["before"] == pytest.approx(_norm_over_positions([[1, 0], [0, 2], [2, 1]])[0], abs=1e-12)
    assert norm1["after"] == pytest.approx(_norm_over_positions([[1, 0], [0, 2], [1, 1]])[0], abs=1e-12)
    assert [round(v, 6) for v in norm1["after"]] == [0.707091, -1.224736] and norm1["change"] > 0.7
    # the same two prompts with the model's own norm: the causal mask keeps position 0 as it was
    masked = json.loads(ok(chapter(*args)))
    assert all(change["change"] == 0 for change in masked["stages"][0].values())


def test_exercise_3_the_text_names_both_prompts_and_the_broken_norm(chapter):
    out = ok(chapter("--ids", "0,1,1", "--position", "0", "--compare-ids", "0,1,2", "--norm-over", "positions"))
    assert out.splitlines()[1:4] == [
        "before: ids 0,1,2: 'a' 'b' 'c' (the compared prompt)",
        "after:  ids 0,1,1: 'a' 'b' 'b'",
        "interventions, in both passes: norm-over positions",
    ]


def test_the_norm_over_positions_is_a_copy_for_watching_and_the_run_keeps_its_norm(chapter):
    run = minigpt.load(config=CHAPTER_CONFIG)
    norm = run.model.blocks[0].norm1
    run.trace(ids=[0, 1, 2], norm_over="positions", compare=False)
    assert run.model.blocks[0].norm1 is norm
    assert [round(v, 6) for v in run.trace(ids=[0, 1, 2], position=0).blocks[0].stages["norm1"]] == [0.99998, -0.99998]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--norm-over", "rows"), "--norm-over 'rows': expected coordinates (the model's own norm, chapter 17.3)"),
        (("--compare-ids", "0,1,2"), "--compare-ids has 3 tokens and the traced prompt 2; the two passes are"),
        (("--compare-ids", "0,5"), "--compare-ids: token id 5 is not in the vocabulary: this model has 3 tokens"),
        (("--compare-ids", "0,1", "--compare", "--scale", "0.ffn=0"), "--compare-ids compares two prompts"),
        (("--norm-over", "positions", "--attribute", "b"), "--attribute splits the logit of the run's own weights"),
    ],
)
def test_exercise_3_refusals(chapter, args, message):
    assert refused(chapter("--ids", "0,1", *args)).startswith("minigpt: error: " + message)


# ------------------------------------------------------------------ exercise 5: the broadcast refused


@pytest.mark.parametrize("update", ["attention", "ffn"])
def test_exercise_5_an_update_broadcast_from_one_row_is_refused_by_the_residual_add(chapter, update):
    assert refused(chapter("--ids", "0,1,2", "--broadcast-update", f"0.{update}")) == (
        f"minigpt: error: --broadcast-update 0.{update}: the block refused it (chapter 17.2): residual add needs "
        "equal shapes, got [1, 3, 2] + [1, 1, 2]; broadcasting would reuse one update for many rows"
    )


def test_exercise_5_an_unknown_update_is_refused(chapter):
    assert refused(chapter("--ids", "0,1", "--broadcast-update", "0.norm1")) == (
        "minigpt: error: --broadcast-update 0.norm1: unknown update 'norm1'; broadcast one of: attention, ffn"
    )


# ------------------------------------------------------------------ exercise 6: pre-norm beside post-norm


def _post_norm_reference(ids: list[int]) -> dict:
    """Chapter 17.6's post-norm block on the shipped weights, from tests/reference.py's scalar parts."""
    run = minigpt.load(POST_RUN)
    weights = reference.weights_from_state_dict({k: v.tolist() for k, v in run.model.state_dict().items()})
    [block] = weights["blocks"]
    x = [reference.add(weights["token_table"][i], weights["position_table"][t]) for t, i in enumerate(ids)]
    attention, _ = reference.attention(
        x, block["qkv_weight"], block["qkv_bias"], block["out_weight"], block["out_bias"], 2
    )
    residual1 = [reference.add(a, b) for a, b in zip(x, attention)]
    norm1 = [reference.layer_norm(r, block["norm1_gain"], block["norm1_bias"], 1e-5) for r in residual1]
    hidden = [reference.relu(reference.linear(r, block["W1_weight"], block["W1_bias"])) for r in norm1]
    ffn = [reference.linear(h, block["W2_weight"], block["W2_bias"]) for h in hidden]
    residual2 = [reference.add(a, b) for a, b in zip(norm1, ffn)]
    norm2 = [reference.layer_norm(r, block["norm2_gain"], block["norm2_bias"], 1e-5) for r in residual2]
    return dict(
        attention=attention, residual1=residual1, norm1=norm1, hidden=hidden, ffn=ffn, residual2=residual2,
        norm2=norm2, output=norm2,
    )  # fmt: skip


def test_exercise_6_the_chapters_weights_run_pre_norm_and_post_norm_side_by_side(chapter):
    data = json.loads(ok(chapter("--ids", "0,1,2", "--compare-run", POST_RUN, "--json")))
    assert data["before"]["model"]["norm_position"] == "post" and data["after"]["model"]["norm_position"] == "pre"
    expected = _post_norm_reference([0, 1, 2])
    rows = data["stages"][0]
    assert list(rows) == ["input", "norm1", "attention", "residual1", "norm2", "hidden", "ffn", "residual2", "output"]
    for name, change in rows.items():
        if name != "input":
            assert change["before"] == pytest.approx(expected[name][2], abs=1e-12), name
    assert rows["residual2"]["after"] is None and rows["residual2"]["change"] is None  # pre-norm has none
    assert [round(v, 6) for v in rows["output"]["after"]] == [2.999964, 3.746396]  # Y of Table 17.1's block


def test_exercise_6_the_text_says_where_the_two_calculations_differ(chapter):
    out = ok(chapter("--ids", "0,1,2", "--position", "0", "--compare-run", POST_RUN, "--digits", "6"))
    lines = out.splitlines()
    assert "[model] differs, before -> after: norm_position 'post' -> 'pre'" in lines
    assert "    before  [1.000000, 1.000000]            = MHA(input)" in lines  # X itself
    assert "    after   [0.000000, 1.999960]            = MHA(norm1)" in lines  # LN(X), Table 17.1's attention
    assert "    before  [0.999998, -0.999998]           = norm2" in lines  # the output normalised
    assert "    after   [1.999980, 2.999940]            = residual1 + ffn" in lines
    assert "    after   (none: a pre-norm block computes no residual2)" in lines
    assert "  residual2    2.236023           -           -" in lines


def test_explore_still_refuses_runs_whose_blocks_compute_in_another_order():
    run = minigpt.load(config=CHAPTER_CONFIG)
    with pytest.raises(MinigptError, match="norm_position 'pre' != 'post'"):
        run.comparison_run(POST_RUN)  # what explore asks: its page compares stage by stage, one order
    assert run.comparison_run(POST_RUN, order_may_differ=True).model.cfg.norm_position == "post"


def test_regenerating_the_post_norm_folder_gives_the_shipped_files(tmp_path):
    spec = importlib.util.spec_from_file_location("make_chapter17", REPO / "scripts" / "make_chapter17.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    config = REPO / "configs" / "chapter17-post.toml"
    assert script.main(["--config", str(config), "--out", str(tmp_path / "post")]) == 0
    for name in ("config.toml", "tokenizer.json", "checkpoint.pt"):
        assert (tmp_path / "post" / name).read_bytes() == (POST_RUN / name).read_bytes(), name


# ------------------------------------------------------------------ the full matrix Y in one command


def test_all_positions_prints_the_full_matrix_y(chapter):
    lines = ok(chapter("--ids", "0,1,2", "--all-positions", "--digits", "6")).splitlines()
    at = lines.index("  output      0 'a'     [1.999980, 2.999940]            [1, 3, 2]")
    assert lines[at + 1 : at + 3] == [
        "              1 'b'     [0.999912, 1.476742]",
        "              2 'c'     [2.999964, 3.746396]",
    ]
    data = json.loads(ok(chapter("--ids", "0,1,2", "--all-positions", "--json")))
    Y = data["all_positions"]["blocks.0.output"]
    assert [f"[{a:.6f}, {b:.6f}]" for a, b in Y] == Y_ROWS
    assert list(data["all_positions"])[:3] == ["token_rows", "position_rows", "input"]
    assert data["all_positions"]["input"] == [[1.0, 0.0], [0.0, 2.0], [2.0, 1.0]]
    assert "all_positions" not in json.loads(ok(chapter("--ids", "0,1,2", "--json")))


def test_all_positions_shows_one_pass_and_refuses_a_comparison_or_a_gradient(chapter):
    assert refused(chapter("--ids", "0,1", "--all-positions", "--compare-ids", "0,2")).startswith(
        "minigpt: error: --all-positions shows every position of one pass"
    )
    assert refused(chapter("--ids", "0,1", "--all-positions", "--grad")).startswith(
        "minigpt: error: --grad is the gradient of one position's loss"
    )
