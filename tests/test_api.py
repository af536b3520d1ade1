"""The Python API (`minigpt.load`, `minigpt.train`): what the commands stand on, for notebooks and
scripts. It gives what the command line gives (the same samples, the same trace), raises
MinigptError with the command line's messages (arguments named as arguments, never as flags), and
prints nothing it was not asked to."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import train_tiny_run

import minigpt


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("api"))


def test_importing_minigpt_loads_no_torch_and_names_the_api():
    code = "import sys, minigpt; print('torch' in sys.modules, minigpt.__all__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False ['MinigptError', '__version__', 'load', 'train']"


def test_train_is_the_function_even_once_every_module_is_imported():
    import minigpt.commands.train  # noqa: F401
    import minigpt.training.trainer  # noqa: F401

    assert callable(minigpt.train) and minigpt.train.__module__ == "minigpt.api.training"


def test_a_sample_is_the_text_the_command_line_prints(run_dir, cli):
    run = minigpt.load(run_dir)
    text = run.sample("ROM", max_new_tokens=12, seed=3, temperature=1.0)
    printed = cli("sample", "--run", run_dir, "-p", "ROM", "-n", "12", "--seed", "3", "--temperature", "1")
    assert printed.exit_code == 0 and printed.stdout == text + ("" if text.endswith("\n") else "\n")
    several = run.sample("ROM", max_new_tokens=5, num_samples=3)
    assert isinstance(several, list) and len(several) == 3 and all(s.startswith("ROM") for s in several)


def test_a_trace_is_the_one_trace_json_prints_and_reads_stages_by_name(run_dir, cli):
    run = minigpt.load(run_dir)
    trace = run.trace("ROMEO")
    printed = json.loads(cli("trace", "--run", run_dir, "-p", "ROMEO", "--json").stdout)
    assert trace.as_dict() == printed
    residual1 = trace.stage(0, "residual1")
    assert residual1.shape == (run.model.cfg.n_embd,)
    assert residual1.tolist() == printed["blocks"][0]["stages"]["residual1"]
    # residual1 = input + attention, at every position (chapter 17.2), read from the same pass
    assert torch.equal(trace.whole(0, "residual1"), trace.whole(None, "input") + trace.whole(0, "attention"))
    # the attention weights of the traced position: each head's row over the keys it sees, as printed
    weights = trace.stage(0, "attention_weights")
    assert weights.shape == (run.model.cfg.n_head, trace.position + 1)
    assert weights.tolist() == printed["blocks"][0]["attention_weights"]
    assert trace.stage(0, "attention_weights", position=0).tolist() == [[1.0]] * run.model.cfg.n_head
    with pytest.raises(minigpt.MinigptError, match="the trace has no stage 'blocks.0.residual3'"):
        trace.stage(0, "residual3")


def test_an_intervention_gives_the_comparison_compare_prints(run_dir, cli):
    run = minigpt.load(run_dir)
    compared = run.trace("ROMEO", scale={"0.attention": 0.0})
    printed = json.loads(
        cli("trace", "--run", run_dir, "-p", "ROMEO", "--scale", "0.attention=0", "--compare", "--json").stdout
    )
    assert compared.as_dict() == printed
    assert torch.count_nonzero(compared.after.stage(0, "attention")) == 0
    assert compared.after.stage(0, "residual1").tolist() == compared.before.stage(None, "input").tolist()


def test_eval_scores_as_the_command_does(run_dir, cli, tiny_text):
    scores = minigpt.load(run_dir).eval(tiny_text)
    printed = json.loads(cli("eval", "--run", run_dir, "--data", tiny_text, "--json").stdout)
    assert (scores.tokens, scores.bits_per_byte, scores.perplexity) == (
        printed["tokens"],
        printed["bits_per_byte"],
        printed["perplexity"],
    )


def test_train_returns_the_run_to_load_and_prints_nothing_without_progress(tiny_config, tmp_path, capsys):
    result = minigpt.train(
        config=tiny_config, out=tmp_path / "run", steps=6, set={"train.eval_interval": 3}, progress=False
    )
    assert capsys.readouterr() == ("", "")
    assert (result.step, result.steps_taken, result.run) == (6, 6, tmp_path / "run")
    assert result.val_loss is not None and result.checkpoint_step == 6
    assert minigpt.load(result.run).model.cfg.n_layer == 1


def test_errors_are_minigpt_errors_naming_arguments_not_flags(run_dir, tmp_path):
    run = minigpt.load(run_dir)
    with pytest.raises(minigpt.MinigptError) as refused:
        run.trace("ROMEO", position=9)
    assert str(refused.value).startswith("position 9 is beyond the prompt")
    with pytest.raises(minigpt.MinigptError) as refused:
        minigpt.train(out=run_dir, progress=False)
    said = refused.value
    assert "already holds a run; pass resume=True to continue it, force=True to replace it, or another out" in str(said)
    assert "pass --resume to continue it, --force to replace it, or another --out" in said.for_command_line
    assert said.parameters == ("resume", "force", "out") and said.values["run_dir"] == run_dir
    with pytest.raises(minigpt.MinigptError, match="sample settings temprature are unknown"):
        run.sample("RO", temprature=0.5)
    with pytest.raises(minigpt.MinigptError) as refused:
        run.sample("RO", top_p=2.0)
    assert str(refused.value) == "top_p 2.0: [sample] top_p = 2.0 must be at most 1.0"
