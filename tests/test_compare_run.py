"""`minigpt trace --compare-run DIR`: what fine-tuning changed. The same tokens through a fine-tune
and the run it started from (or any run of the same shape and tokenizer): each pass is exactly the
run's own `trace --json`, each change's norm the norm of the rows' difference, the KL divergence
the one of the two runs' own next-token distributions; `--compare-run origin` finds the run
origin.json names, and refuses, in one line, an origin that is missing, moved or changed, as it
refuses runs of other shapes or tokenizers. The explore page's backend answers the same. Tiny
char-level runs, so every test is fast."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import fine_tune_tiny_run, train_tiny_run

import minigpt
from minigpt.config import load_config
from minigpt.errors import MinigptError
from minigpt.explore.explorer import Explorer
from minigpt.model.gpt import MiniGPT
from minigpt.runs.folder import write_model_run
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny char run, 20 steps on the first 20,000 characters of Tiny Shakespeare."""
    return train_tiny_run(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def ft(base, tmp_path_factory):
    return fine_tune_tiny_run(base, tmp_path_factory.mktemp("ft") / "ft")


def trace_json(cli, run: Path, *args) -> dict:
    result = cli("trace", "--run", run, "-p", PROMPT, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refused(cli, *args) -> str:
    """The one line a refused command prints, checked to be one line on stderr and exit 2."""
    result = cli(*args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error: "), result.stderr
    return lines[0]


def next_token_log_probabilities(run: Path, prompt: str) -> torch.Tensor:
    """log softmax of the model's own forward logits at the last position, in float64: by the run's
    model directly, not through the trace."""
    loaded = minigpt.load(run)
    ids = torch.tensor([loaded.tokenizer.encode(prompt)])
    with torch.no_grad():
        logits, _ = loaded.model(ids)
    return torch.log_softmax(logits[0, -1].double(), dim=-1)


# ---------------------------------------------------------------- the comparison


def test_each_pass_is_the_runs_own_trace_and_each_change_the_norm_of_the_difference(cli, base, ft):
    compared = trace_json(cli, ft, "--compare-run", base)
    assert compared["run"] == str(ft) and compared["compared_run"] == str(base)
    assert compared["interventions"] == []
    # before is the compared run's pass and after this run's: exactly what each run's trace prints
    assert compared["before"] == trace_json(cli, base)
    assert compared["after"] == trace_json(cli, ft)
    before, after = compared["before"], compared["after"]
    assert before["blocks"][0]["stages"]["ffn"] != after["blocks"][0]["stages"]["ffn"]  # fine-tuning moved it
    for b, block in enumerate(compared["stages"]):
        assert list(block) == ["input", *before["blocks"][b]["stages"]]
        rows = [{"input": t["blocks"][b]["input"]["row"], **t["blocks"][b]["stages"]} for t in (before, after)]
        for name, change in block.items():
            assert change["before"] == rows[0][name] and change["after"] == rows[1][name]
            first, second = torch.tensor(change["before"], dtype=torch.float64), torch.tensor(change["after"])
            assert change["norm_before"] == pytest.approx(torch.linalg.norm(first).item(), rel=1e-12)
            assert change["norm_after"] == pytest.approx(torch.linalg.norm(second.double()).item(), rel=1e-12)
            assert change["change"] == pytest.approx(torch.linalg.norm(second.double() - first).item(), rel=1e-12)
            assert change["change"] > 0
    # KL(before || after), from the two models' own logits (their fast path: float32 agreement)
    p, q = next_token_log_probabilities(base, PROMPT), next_token_log_probabilities(ft, PROMPT)
    kl = torch.sum(p.exp() * (p - q)).item()
    assert compared["kl_divergence"] == pytest.approx(kl, rel=1e-5) and kl > 0


def test_origin_is_the_run_the_fine_tune_started_from(cli, base, ft):
    assert trace_json(cli, ft, "--compare-run", "origin") == trace_json(cli, ft, "--compare-run", base)
    assert minigpt.load(ft).origin_run().path == base


def test_the_text_view_says_which_run_each_pass_is(cli, base, ft):
    result = cli("trace", "--run", ft, "-p", PROMPT, "--compare-run", base, "--block", "0")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1:3] == [f"before: run {base} (the compared run)", f"after:  run {ft}"]
    assert not any(line.startswith("interventions") for line in lines)  # none made
    kl = trace_json(cli, ft, "--compare-run", base)["kl_divergence"]
    assert lines[-1] == f"KL(before || after) = {kl:.4f} nats"


def test_interventions_are_made_in_both_passes(cli, base, ft):
    edits = ("--scale", "0.attention=0.5", "--ablate-head", "0.1")
    compared = trace_json(cli, ft, "--compare-run", base, *edits)
    assert compared["interventions"] == ["scale 0.attention=0.5", "ablate-head 0.1"]
    assert compared["before"] == trace_json(cli, base, *edits)  # the modified pass of each run
    assert compared["after"] == trace_json(cli, ft, *edits)
    text = cli("trace", "--run", ft, "-p", PROMPT, "--compare-run", base, *edits).stdout
    assert "interventions, in both passes: scale 0.attention=0.5; ablate-head 0.1" in text


def test_the_api_compares_with_a_loaded_run_with_gradients_and_attributions_of_each(base, ft):
    run, other = minigpt.load(ft), minigpt.load(base)
    result = run.trace(PROMPT, compare_run=other, grad=True, attribute="e", position=3)
    assert result.compared_run == str(base) and result.run == str(ft)
    alone = other.trace(PROMPT, grad=True, attribute="e", position=3)
    assert result.before.as_dict() == alone.as_dict()
    assert result.after.as_dict() == run.trace(PROMPT, grad=True, attribute="e", position=3).as_dict()
    # both gradients are of the loss of one target: at position 3 the prompt's next token
    assert result.before.gradient.target_id == result.after.gradient.target_id == run.tokenizer.encode("O")[0]
    assert result.as_dict() == run.trace(PROMPT, compare_run=str(base), grad=True, attribute="e", position=3).as_dict()


def test_runs_of_one_shape_may_differ_in_what_they_compute_and_the_text_says_how(cli, base, ft, tmp_path):
    gelu = other_run(tmp_path / "gelu", base, "model.activation='gelu'", "model.bias=false")
    compared = trace_json(cli, ft, "--compare-run", gelu)
    assert compared["before"] == trace_json(cli, gelu) and compared["after"] == trace_json(cli, ft)
    lines = cli("trace", "--run", ft, "-p", PROMPT, "--compare-run", gelu).stdout.splitlines()
    assert lines[3:5] == ["[model] differs, before -> after: activation 'gelu' -> 'relu';", "bias False -> True"]


# ---------------------------------------------------------------- refusals


def other_run(folder: Path, base: Path, *overrides: str, tokenizer=None) -> Path:
    """A run folder of random weights, with `base`'s config but for `overrides` and its tokenizer
    unless another is given."""
    cfg = load_config(base / "config.toml", list(overrides))
    tokenizer = tokenizer or minigpt.load(base).tokenizer
    write_model_run(folder, cfg, MiniGPT(cfg.model, tokenizer.vocab_size), tokenizer)
    return folder


def test_runs_of_another_shape_or_tokenizer_are_refused_naming_what_differs(cli, base, ft, tmp_path):
    wider = other_run(tmp_path / "wider", base, "model.n_layer=2", "model.n_embd=32")
    line = refused(cli, "trace", "--run", ft, "-p", PROMPT, "--compare-run", wider)
    assert line == (
        f"minigpt: error: --compare-run {wider} is not the shape of {ft} (n_layer 1 != 2; n_embd 16 != 32: this "
        "run's first), so their stages cannot be compared one by one; compare runs of the same shape (a fine-tune "
        "and its origin)"
    )
    alphabet = sorted(minigpt.load(base).tokenizer.alphabet)
    assert "~" not in alphabet
    swapped = TextTokenizer(train_tokenizer("char", 0, "".join(alphabet[:-1]) + "~"))  # as many ids, one other
    other = other_run(tmp_path / "other-tokenizer", base, tokenizer=swapped)
    line = refused(cli, "trace", "--run", ft, "-p", "RO", "--compare-run", other)
    assert line == (
        f"minigpt: error: --compare-run {other} has another tokenizer than {ft} (their tokenizer.json differ), "
        "so the same ids are not the same text; compare runs with one tokenizer (a fine-tune and its origin)"
    )


def test_a_missing_folder_a_folder_that_is_no_run_and_compare_together_are_refused(cli, ft, base, tmp_path):
    missing = tmp_path / "nowhere"
    assert refused(cli, "trace", "--run", ft, "-p", PROMPT, "--compare-run", missing) == (
        f"minigpt: error: --compare-run {missing}: no such run folder; give a run of the same shape and tokenizer"
    )
    assert refused(cli, "trace", "--run", ft, "-p", PROMPT, "--compare-run", tmp_path) == (
        f"minigpt: error: --compare-run {tmp_path} is not a run folder (it has no config.toml); give a run of "
        "the same shape and tokenizer"
    )
    line = refused(cli, "trace", "--run", ft, "-p", PROMPT, "--compare-run", base, "--compare", "--scale", "0.ffn=0")
    assert line.startswith("minigpt: error: --compare compares a pass with and without interventions, --compare-run")
    with pytest.raises(MinigptError, match="a patch puts back one run's clean activation"):
        minigpt.load(ft).trace(PROMPT, compare_run=base, patch={"clean": "JULIET", "block": 0, "stage": "ffn"})


def test_origin_refuses_a_run_that_is_no_fine_tune_or_an_import(cli, base, tmp_path):
    assert refused(cli, "trace", "--run", base, "-p", PROMPT, "--compare-run", "origin") == (
        f"minigpt: error: run {base} has no origin.json: it was not fine-tuned from another run, so it has no "
        "origin run; pass --compare-run DIR, a run folder of the same shape and tokenizer"
    )
    imported = tmp_path / "imported"
    shutil.copytree(base, imported)
    (imported / "origin.json").write_text(json.dumps({"kind": "hf-gpt2", "path": "/models/gpt2", "sha256": "0"}))
    assert refused(cli, "trace", "--run", imported, "-p", PROMPT, "--compare-run", "origin") == (
        f"minigpt: error: run {imported} was imported (hf-gpt2 /models/gpt2), not fine-tuned from a run folder, "
        "so it has no origin run; pass --compare-run DIR, a run folder of the same shape and tokenizer"
    )


def test_an_origin_moved_or_trained_further_is_refused_and_where_it_is_now_can_be_passed(cli, tmp_path):
    (tmp_path / "source").mkdir()
    source = train_tiny_run(tmp_path / "source")
    tuned = fine_tune_tiny_run(source, tmp_path / "tuned", steps=2)
    moved = tmp_path / "moved"
    source.rename(moved)
    line = refused(cli, "trace", "--run", tuned, "-p", PROMPT, "--compare-run", "origin")
    assert line == (
        f"minigpt: error: run {tuned} was fine-tuned from {source / 'checkpoint.pt'} (origin.json says), which is "
        "not there: the run was moved or removed; pass --compare-run DIR, a run folder of the same shape and "
        "tokenizer (where it is now)"
    )
    assert trace_json(cli, tuned, "--compare-run", moved)["compared_run"] == str(moved)
    moved.rename(source)
    assert trace_json(cli, tuned, "--compare-run", "origin")["compared_run"] == str(source)
    # the source trained anew in its folder: its checkpoint is no longer the one the fine-tune started from
    result = cli(
        "train", "-c", tmp_path / "source" / "tiny.toml", "--out", source, "--force", "--steps", "5", "--quiet"
    )
    assert result.exit_code == 0, result.output
    assert refused(cli, "trace", "--run", tuned, "-p", PROMPT, "--compare-run", "origin") == (
        f"minigpt: error: run {tuned} was fine-tuned from {source / 'checkpoint.pt'}, which has changed since "
        "(trained further or replaced: its sha256 is not the one origin.json records); pass --compare-run DIR, "
        "a run folder of the same shape and tokenizer to compare with it as it is now"
    )
    assert trace_json(cli, tuned, "--compare-run", source)["compared_run"] == str(source)


# ---------------------------------------------------------------- the explore page's backend


def test_the_explorer_compares_with_the_run_it_was_started_with(base, ft):
    run, other = minigpt.load(ft), minigpt.load(base)
    explorer = Explorer(run, run.comparison_run("origin"))
    assert explorer.model_info()["compare_run"] == str(base)
    request = {"prompt": PROMPT, "compare_run": True, "scale": ["0.ffn=0.5"]}
    answer = explorer.trace({**request, "views": True})
    expected = run.trace(PROMPT, compare_run=other, scale=["0.ffn=0.5"]).as_dict()
    assert {k: v for k, v in answer.items() if k != "views"} == expected
    assert set(answer["views"]["norms"]) == {"before", "after"}
    # the bars of each pass: its own logits, ranked (the trace's top five first)
    bars = explorer.next_tokens({**request, "temperature": 1.0})
    for shown, name in ((bars["before"], "before"), (bars, "after")):
        top = [(c["id"], c["logit"]) for c in shown["candidates"][:5]]
        assert top == [(c["id"], c["logit"]) for c in expected[name]["next_tokens"]]
    assert "before" not in explorer.next_tokens({"prompt": PROMPT})  # unticked: this run alone
    assert Explorer(run).model_info()["compare_run"] is None
    with pytest.raises(MinigptError, match=r"^compare_run=True: this server was started without a run to compare"):
        Explorer(run).trace({"prompt": PROMPT, "compare_run": True})
    with pytest.raises(MinigptError, match=r"^compare_run 'yes' must be true or false$"):
        explorer.trace({"prompt": PROMPT, "compare_run": "yes"})


def test_explore_refuses_a_run_of_another_shape_at_start(cli, base, ft, tmp_path):
    wider = other_run(tmp_path / "wider", base, "model.n_layer=2")
    line = refused(cli, "explore", "--run", ft, "--compare-run", wider, "--port", "0")
    assert line.startswith(f"minigpt: error: --compare-run {wider} is not the shape of {ft} (n_layer 1 != 2")
