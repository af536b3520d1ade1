"""LoRA fine-tuning (`[train] lora_rank`): adapters on a frozen trained model. The adapted model
starts as exactly its base, only the adapters train (no gradient or optimizer state elsewhere),
checkpoints hold the adapters and name the base by sha256, a LoRA run resumes bitwise, every
reading command sees the merged model, and what cannot be done is refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.request

import pytest
import torch
from conftest import power_cut_at, serving, train_tiny_run

from minigpt.config import load_config
from minigpt.memory import lora_parameter_count, training_bytes
from minigpt.model import lora
from minigpt.model.gpt import MiniGPT
from minigpt.runs.reading import load_model
from minigpt.text.corpus import Batches, load_corpus
from minigpt.training.trainer import evaluate

LORA = ["--set", "train.lora_rank=2", "--set", "train.learning_rate=1e-2"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny char run of two blocks (20 steps on the first 20,000 characters of Tiny Shakespeare)."""
    return train_tiny_run(tmp_path_factory.mktemp("base"), "--set", "model.n_layer=2")


def fine_tune(cli, base, out, *extra):
    result = cli("train", "-c", base / "config.toml", "--init-from", base, "--out", out, "--quiet", *LORA, *extra)
    assert result.exit_code == 0, result.output
    return out


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def payload(run, name="checkpoint.pt"):
    return torch.load(run / name, weights_only=True)


def one_line(result, code=2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error: "), lines
    return lines[0]


def test_the_adapted_model_starts_as_exactly_its_base(cli, base, tmp_path):
    out = fine_tune(cli, base, tmp_path / "lora", "--steps", "4", "--set", "train.eval_interval=2")
    first = next(r for r in metrics(out) if r.get("eval"))
    cfg = load_config(out / "config.toml")
    model, tokenizer = load_model(load_config(base / "config.toml"), base)
    corpus = load_corpus(cfg, tokenizer=tokenizer)
    windows = Batches(corpus.val_ids, cfg.model.context, cfg.train.batch_size).fixed(cfg.train.eval_batches)
    assert first["step"] == 0
    assert first["val_loss"] == evaluate(model, windows, corpus.val_tokens_per_byte)["val_loss"]  # bitwise
    # and with B = 0 every adapted matrix computes the base's output exactly
    torch.manual_seed(0)
    adapted = MiniGPT(model.cfg, model.vocab_size)
    adapted.load_state_dict(model.state_dict())
    lora.attach(adapted, lora.settings_of(cfg.train, {}))
    x = windows[0][0]
    assert torch.equal(adapted.eval()(x)[0], model(x)[0])


def test_only_the_adapters_train_and_the_checkpoint_holds_them_alone(cli, base, tmp_path):
    out = fine_tune(cli, base, tmp_path / "lora", "--steps", "6")
    saved = payload(out)
    names = set(saved["model"])
    # two blocks x (qkv, out, W1, W2) x (A, B), nothing of the base
    assert names == {
        f"blocks.{b}.{m}.{ab}"
        for b in range(2)
        for m in ("attention.qkv", "attention.out", "ffn.W1", "ffn.W2")
        for ab in ("lora_A", "lora_B")
    }
    assert saved["lora"]["rank"] == 2 and saved["lora"]["targets"] == "qkv,out,W1,W2"
    base_sha = hashlib.sha256((base / "checkpoint.pt").read_bytes()).hexdigest()
    assert saved["lora"]["base"]["sha256"] == base_sha == saved["origin"]["sha256"]
    assert len(saved["optimizer"]["state"]) == len(names)  # AdamW state for the adapters alone
    assert all(saved["model"][n].abs().max() > 0 for n in names if n.endswith("lora_B"))  # B left zero: trained
    # The merged model is the base plus (alpha / r) B A, exactly where nothing was adapted.
    merged, _ = load_model(load_config(out / "config.toml"), out)
    original = payload(base)["model"]
    state = merged.state_dict()
    scale = saved["lora"]["alpha"] / saved["lora"]["rank"]
    for name, tensor in state.items():
        adapted = name.removesuffix(".weight") + ".lora_A" in names
        if not adapted:
            assert torch.equal(tensor, original[name]), name
        else:
            prefix = name.removesuffix(".weight")
            delta = saved["model"][prefix + ".lora_B"].double() @ saved["model"][prefix + ".lora_A"].double() * scale
            assert torch.equal(tensor, (original[name].double() + delta).float()), name


def test_an_interrupted_lora_run_resumes_bitwise(cli, base, tmp_path):
    settings = ["--steps", "12", "--set", "train.checkpoint_interval=6", "--set", "train.eval_interval=6"]
    straight = fine_tune(cli, base, tmp_path / "straight", *settings)
    run = tmp_path / "crashed"
    with power_cut_at(12):
        crashed = cli("train", "-c", base / "config.toml", "--init-from", base, "--out", run, "--quiet", *LORA,
                      *settings)  # fmt: skip
    assert isinstance(crashed.exception, RuntimeError)
    assert payload(run)["step"] == 6
    fine_tune(cli, base, run, *settings, "--resume")
    a, b = payload(straight)["model"], payload(run)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_reading_commands_use_the_merged_model(cli, base, tmp_path):
    out = fine_tune(cli, base, tmp_path / "lora", "--steps", "6")
    text = base.parent / "tiny.txt"
    reading = (["sample", "-p", "RO", "-n", "5"], ["trace", "-p", "ROMEO"], ["eval", "--data", text])
    for args in reading:
        result = cli(*args, "--run", out)
        assert result.exit_code == 0, (args, result.output)
    best, _ = load_model(load_config(out / "config.toml"), out, checkpoint="best")
    assert "lora" in payload(out, "best.pt")  # best.pt holds adapters too, and names its base
    assert not lora.has_adapters(best)


def test_a_moved_or_changed_base_is_refused_saying_what_to_do(cli, base, tmp_path):
    out = fine_tune(cli, base, tmp_path / "lora", "--steps", "2")
    copy = tmp_path / "base-copy"
    shutil.copytree(base, copy)
    moved = fine_tune(cli, copy, tmp_path / "lora-of-copy", "--steps", "2")
    shutil.rmtree(copy)
    line = one_line(cli("sample", "--run", moved, "-p", "RO", "-n", "2"))
    assert "which is not there any more" in line and str(copy) in line
    shutil.copytree(base, copy)
    (copy / "checkpoint.pt").write_bytes((base / "best.pt").read_bytes())  # another checkpoint in its place
    line = one_line(cli("trace", "--run", moved, "-p", "RO"))
    assert "has changed since" in line
    assert cli("sample", "--run", out, "-p", "RO", "-n", "2").exit_code == 0  # its own base is untouched


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--set", "train.lora_targets=qkv,ffn"], 'lora_targets = "qkv,ffn" is not a list of distinct matrices'),
        (["--set", 'train.optimizer="muon"'], 'optimizer = "muon" with lora_rank = 2 is refused'),
    ],
)
def test_impossible_lora_settings_are_refused_in_one_line(cli, base, tmp_path, extra, expected):
    result = cli("train", "-c", base / "config.toml", "--init-from", base, "--out", tmp_path / "x", *LORA, *extra)
    assert expected in one_line(result)
    assert not (tmp_path / "x").exists()


def test_lora_from_scratch_is_refused_there_is_nothing_to_adapt(cli, base, tmp_path):
    line = one_line(cli("train", "-c", base / "config.toml", "--out", tmp_path / "x", *LORA))
    assert "nothing to adapt" in line and "--init-from" in line


def test_the_memory_check_counts_what_lora_holds():
    cfg = load_config(None, ["model.n_layer=12", "model.n_embd=768", "model.ffn_hidden=3072", "model.n_head=12"]).model
    full = training_bytes(cfg, 50257, 32, "adamw")
    adapted = training_bytes(cfg, 50257, 32, "adamw", (8, "qkv,out,W1,W2"))
    assert adapted < full
    model = MiniGPT(load_config(None, ["model.n_layer=2", "model.n_embd=16", "model.ffn_hidden=32"]).model, 50)
    settings = {"rank": 3, "alpha": 16.0, "dropout": 0.0, "targets": "qkv,out,W1,W2", "base": {}}
    lora.attach(model, settings)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == lora_parameter_count(model.cfg, 3, "qkv,out,W1,W2")


def test_recompute_trains_the_same_weights_with_less_memory_held(cli, base, tmp_path):
    """[train] recompute: each block computed again in the backward pass gives the same gradients,
    so the same run, bitwise (float32 matmuls, one thread), for a LoRA run and a full one alike."""
    exact = ["--steps", "3", "--set", 'train.precision="float32"']
    for extra in ([], ["--set", "train.lora_rank=0"]):
        plain = fine_tune(cli, base, tmp_path / f"plain{len(extra)}", *exact, *extra)
        again = fine_tune(cli, base, tmp_path / f"again{len(extra)}", *exact, *extra, "--set", "train.recompute=true")
        a, b = payload(plain)["model"], payload(again)["model"]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    shape = ["model.n_layer=12", "model.n_embd=768", "model.ffn_hidden=3072", "model.n_head=12", "model.context=128"]
    cfg = load_config(None, shape).model
    adapters = (8, "qkv,out,W1,W2")
    held = training_bytes(cfg, 50257, 8, "adamw", adapters, recompute=True)
    assert held < training_bytes(cfg, 50257, 8, "adamw", adapters) - 0.8 * 2**30  # GPT-2 small: 0.9 GiB less


def test_samples_while_a_lora_run_trains_are_the_adapted_models(base, tmp_path):
    """Sampling folds the norms into a copy of the model: a LoRA model is folded as its merged copy,
    so its samples are the adapted model's, not the base's."""
    from minigpt.config import SampleConfig
    from minigpt.sampling.generate import generate

    model, _ = load_model(load_config(base / "config.toml"), base)
    settings = {"rank": 2, "alpha": 16.0, "dropout": 0.0, "targets": "qkv,out,W1,W2", "base": {}}
    lora.attach(model, settings)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("lora_B"):
                parameter.normal_(0.0, 0.5)  # an update far from zero
    model.eval()
    greedy = SampleConfig(max_new_tokens=12, greedy=True)
    adapted = [int(step.tokens[0]) for step in generate(model, [1, 2, 3], greedy)]
    merged = [int(step.tokens[0]) for step in generate(lora.merged(model).eval(), [1, 2, 3], greedy)]
    plain, _ = load_model(load_config(base / "config.toml"), base)
    assert adapted == merged != [int(step.tokens[0]) for step in generate(plain, [1, 2, 3], greedy)]


def test_a_lora_runs_trace_and_page_compare_with_its_base_unless_told_not_to(cli, base, tmp_path):
    out = fine_tune(cli, base, tmp_path / "lora", "--steps", "4", "--set", "train.learning_rate=0.05")
    compared = json.loads(cli("trace", "--run", out, "-p", "ROMEO", "--json").stdout)
    assert compared["compared_run"] == str(base) and "kl_divergence" in compared
    alone = json.loads(cli("trace", "--run", out, "-p", "ROMEO", "--json", "--compare-run", "none").stdout)
    assert "compared_run" not in alone and alone["blocks"] == compared["after"]["blocks"]
    for flags, beside in (((), str(base)), (("--compare-run", "none"), None)):
        with serving(out, *flags) as url, urllib.request.urlopen(url + "api/model", timeout=60) as answer:
            assert json.load(answer)["compare_run"] == beside, flags
