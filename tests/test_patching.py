"""Activation patching (`minigpt patch`, `run.patch`): every effect checked against patching done
here with PyTorch's own hooks on the model's modules, one full forward pass per patch (no Recorder,
no batching, no cache); the exact values the arithmetic decides; refusals in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import Numbered, need, random_run
from typer.testing import CliRunner

from minigpt.api import MinigptError, Run, load
from minigpt.cli import app
from minigpt.config import ModelConfig
from minigpt.inspection.patching import Pass, Patch, patched_finals
from minigpt.model.gpt import MiniGPT

REPO = Path(__file__).resolve().parents[1]
LESSON = ["-c", str(REPO / "configs" / "lesson09.toml")]
CLEAN, CORRUPT = [3, 1, 4, 1, 5, 9, 2], [3, 1, 7, 1, 5, 9, 2]  # differ at position 2 only
ANSWER, VERSUS = 6, 8


def text(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


@pytest.fixture(scope="module")
def run() -> Run:
    cfg = ModelConfig(n_layer=3, n_head=2, n_embd=8, ffn_hidden=16, context=8, dtype="float64")
    return random_run(cfg, 12, Numbered(), seed=0)


# ---------------------------------------------------------------- the reference: hooks, one pass each


def hooked_values(model: MiniGPT, ids: list[int]) -> dict[tuple[int, str], torch.Tensor]:
    """Every block's stages of one pass, [T, C], as hooks see them; heads as W_O's input [T, C]."""
    seen, handles = {}, []
    for i, block in enumerate(model.blocks):

        def keep(key):
            return lambda module, args, output: seen.__setitem__(key, output[0].detach().clone())

        def keep_input(key):
            return lambda module, args: seen.__setitem__(key, args[0][0].detach().clone())

        handles += [
            block.register_forward_pre_hook(keep_input((i, "input"))),
            block.attention.register_forward_hook(keep((i, "attention"))),
            block.norm2.register_forward_pre_hook(keep_input((i, "residual1"))),
            block.ffn.register_forward_hook(keep((i, "ffn"))),
            block.register_forward_hook(keep((i, "output"))),
            block.attention.out.register_forward_pre_hook(keep_input((i, "heads"))),
        ]
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0][0, -1]
    finally:
        for handle in handles:
            handle.remove()
    seen["difference"] = logits[ANSWER] - logits[VERSUS]
    return seen


def hooked_difference(model: MiniGPT, clean: dict, patch: Patch, d: int) -> float:
    """The corrupt prompt's logit difference with one clean value put back by a hook."""
    block = model.blocks[patch.block]
    positions = slice(None) if patch.position is None else patch.position

    def put(row: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        row = row.clone()
        row[0, positions] = value[positions]
        return row

    if patch.stage == "input":
        handle = block.register_forward_pre_hook(
            lambda m, args: (put(args[0], clean[(patch.block, "input")]), *args[1:])
        )
    elif patch.stage in ("attention", "ffn", "output"):
        module = {"attention": block.attention, "ffn": block.ffn, "output": block}[patch.stage]
        handle = module.register_forward_hook(lambda m, args, out: put(out, clean[(patch.block, patch.stage)]))
    elif patch.stage == "residual1":  # residual1 = input + attention: the attention that makes it the clean row
        entering = {}
        pre = block.register_forward_pre_hook(lambda m, args: entering.__setitem__("x", args[0]))
        target = clean[(patch.block, "residual1")]

        def fix(m, args, out):
            wanted = out.clone()
            wanted[0, positions] = target[positions] - entering["x"][0, positions]
            return wanted

        post = block.attention.register_forward_hook(fix)
        handle = type("Both", (), {"remove": lambda self: (pre.remove(), post.remove())})()
    else:  # one head's slice of W_O's input
        columns = slice(patch.head * d, (patch.head + 1) * d)

        def head(m, args):
            joined = args[0].clone()
            joined[0, positions, columns] = clean[(patch.block, "heads")][positions, columns]
            return (joined,)

        handle = block.attention.out.register_forward_pre_hook(head)
    try:
        return float(hooked_values(model, CORRUPT)["difference"])
    finally:
        handle.remove()


@pytest.mark.parametrize("by", ["stage", "head"])
def test_every_effect_equals_patching_by_hooks_one_full_pass_each(run, by):
    result = run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS, by=by)
    clean = hooked_values(run.model, CLEAN)
    high, low = float(clean["difference"]), float(hooked_values(run.model, CORRUPT)["difference"])
    assert result.clean.logit_difference == pytest.approx(high, abs=1e-12)
    assert result.corrupt.logit_difference == pytest.approx(low, abs=1e-12)
    n_layer, n_head, T = 3, 2, len(CLEAN)
    assert len(result.effects) == (n_layer * 5 * T if by == "stage" else n_layer * n_head * (T + 1))
    d = run.model.cfg.n_embd // n_head
    for e in result.effects:
        expected = (hooked_difference(run.model, clean, Patch(e.block, e.stage, e.position, e.head), d) - low) / (
            high - low
        )
        assert e.effect == pytest.approx(expected, abs=1e-9), e


def test_what_the_arithmetic_decides_is_exact(run):
    result = run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS)
    last = len(CLEAN) - 1
    assert result.effect(2, "output", last) == 1.0  # the last block's output at the last position
    for e in result.effects:
        if e.position < 2:  # equal tokens before the first difference, which nothing earlier reaches
            assert e.effect == 0.0, e
        if e.block == 2 and e.stage != "input" and e.position < last:  # past the last attention: reaches nothing
            assert e.effect == 0.0, e
    heads = run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS, by="head")
    assert all(e.effect == 0.0 for e in heads.effects if e.position is not None and e.position < 2)


def test_patching_nothing_reproduces_the_corrupt_run_bitwise(run):
    model = run.model
    with torch.inference_mode():
        clean, corrupt = Pass(model, CLEAN), Pass(model, CORRUPT)
        rows = patched_finals(model, clean, corrupt, [Patch(b, "input", p) for b in range(3) for p in (0, 1)])
    plain = run.trace(ids=CORRUPT).whole(2, "output")[-1]  # the corrupt prompt's own pass, recorded
    assert all(torch.equal(row, plain) for row in rows)
    assert torch.equal(corrupt.final, plain)


def test_the_lesson_run_from_the_command_line_fits_80_columns_and_its_json_is_the_effects():
    args = ["patch", *LESSON, "--clean", "abc", "--corrupt", "adc", "--answer", "b", "--versus", "c"]
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == 0, shown.stderr
    assert all(len(line) <= 80 for line in shown.stdout.splitlines())
    assert "residual1 patched" in shown.stdout and "1:'b'" in shown.stdout
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert set(data) >= {"clean", "corrupt", "effects", "answer", "versus", "by"}
    assert data["clean"]["tokens"] == ["a", "b", "c"] and data["corrupt"]["ids"] == [0, 3, 2]
    assert {"block", "stage", "position", "head", "effect"} == set(data["effects"][0])
    by_place = {(e["stage"], e["position"]): e["effect"] for e in data["effects"]}
    assert by_place[("input", 1)] == 1.0 and by_place[("output", 2)] == 1.0 and by_place[("input", 0)] == 0.0
    heads = CliRunner().invoke(app, [*args, "--by", "head"])
    assert heads.exit_code == 0 and "head 1" in heads.stdout
    assert all(len(line) <= 80 for line in heads.stdout.splitlines())


def test_a_long_prompt_wraps_its_grid_into_bands_within_80_columns(run):
    from minigpt.inspection.why_text import render_patching

    clean = [3, 1, 4, 1, 5, 9, 2, 6]
    corrupt = [3, 1, 4, 1, 5, 9, 2, 7]
    shown = render_patching(run.patch(text(clean), text(corrupt), ANSWER, VERSUS))
    assert all(len(line) <= 80 for line in shown.splitlines())
    assert "7:'t6'" in shown  # the last column is there, in a band of its own


@pytest.mark.parametrize(
    "args, message",
    [
        (["--clean", "abc", "--corrupt", "ad"], "the clean prompt has 3 tokens and the corrupt one 2"),
        (["--clean", "abc", "--corrupt", "adc", "--answer", "bc"], "--answer 'bc' encodes to 2 tokens"),
        (["--clean", "abc", "--corrupt", "adc", "--versus", "b"], "--answer and --versus are the same token ('b', #1)"),
        (["--clean", "abcda", "--corrupt", "adcda"], "the prompt has 5 tokens but the position table has 4 rows"),
        (["--clean", "abc", "--corrupt", "abc"], "the clean and the corrupt prompt end in the same logit difference"),
        (["--by", "block"], "--by 'block': patch by one of: stage, head"),
        (["--corrupt", ""], "--corrupt is missing"),
    ],
)
def test_what_cannot_be_patched_is_refused_in_one_line(args, message):
    given = {"--clean": "abc", "--corrupt": "adc", "--answer": "b", "--versus": "c"}
    words = list(args)
    for flag, value in given.items():
        if flag not in words:
            words += [flag, value]
    result = CliRunner().invoke(app, ["patch", *LESSON, *words])
    assert result.exit_code == 2 and result.stdout == "", (result.stdout, result.exception)
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_the_png_draws_the_sweep(tmp_path):
    need("matplotlib")
    out = tmp_path / "patch.png"
    args = ["patch", *LESSON, "--clean", "abc", "--corrupt", "adc", "--answer", "b", "--versus", "c", "--png", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_api_refuses_in_its_own_words():
    run = load(None, config=REPO / "configs" / "lesson09.toml")
    with pytest.raises(MinigptError, match="answer and versus are the same token"):
        run.patch("abc", "adc", "b", 1)


@pytest.mark.parametrize(
    "command",
    [
        "minigpt trace -c configs/lesson09.toml --ids 0,1,2 --attribute c --versus b",
        "minigpt patch -c configs/lesson09.toml --clean abc --corrupt adc --answer c --versus b",
    ],
)
def test_the_why_that_token_guides_lesson_output_is_what_the_command_prints(command, monkeypatch):
    guide = (REPO / "docs" / "guide" / "why-that-token.md").read_text(encoding="utf-8")
    shown = guide.split(f"$ {command}\n", 1)[1].split("```", 1)[0].removeprefix("...\n").rstrip("\n")
    monkeypatch.chdir(REPO)
    printed = CliRunner().invoke(app, command.split()[1:]).stdout.rstrip("\n")
    assert printed.endswith(shown), (printed, shown)
