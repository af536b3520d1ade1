"""An imported Llama-family model through the commands a learner runs on it, from the command line,
each checked against transformers' own model on the same folder (float32): greedy sampling writes
transformers' greedy tokens, eval's loss is transformers' loss, `trace --attribute`'s parts sum to
the logit within 1e-4, and `patch` keeps its exact end points (1 at the last block's output at the
last position, 0 before the first difference). A fine-tune and a LoRA fine-tune of it train.

The folder: grouped-query attention (6 query heads, 2 kv heads), W_Q/W_K/W_V biases (Qwen2's),
llama3 rope scaling, a tied head; random weights from scripts/random_hf_folder.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHAKESPEARE, lazy_module
from hf_folders import random_hf_folder
from typer.testing import CliRunner

from minigpt.cli import app

transformers = lazy_module("transformers")

PROMPT = "ROMEO: what light"
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def invoke(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(folder, run): the random folder and its import."""
    root = tmp_path_factory.mktemp("llama-commands")
    folder = random_hf_folder().make_folder(
        root / "folder", "qwen2", n_layer=2, tie=True, rope_scaling=LLAMA3, max_pos=64, std=0.1, seed=3
    )
    invoke("import", "hf", folder, "--out", root / "run")
    return folder, root / "run"


@pytest.fixture(scope="module")
def theirs(imported):
    folder, _ = imported
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    return model.eval(), transformers.AutoTokenizer.from_pretrained(folder)


def test_greedy_sampling_writes_transformers_greedy_tokens(imported, theirs):
    _, run = imported
    model, tokenizer = theirs
    ours = json.loads(invoke("sample", "--run", run, "-p", PROMPT, "-n", 30, "--greedy", "--json").splitlines()[0])
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    assert ours["prompt_ids"] == ids[0].tolist()
    with torch.no_grad():
        generated = model.generate(ids, do_sample=False, max_new_tokens=30, use_cache=True)
    assert ours["token_ids"] == generated[0, ids.shape[1] :].tolist()


def test_eval_s_loss_is_transformers_loss(imported, theirs, tmp_path):
    _, run = imported
    model, tokenizer = theirs
    text = SHAKESPEARE.read_text(encoding="utf-8")[:70]  # one window: fewer tokens than the context
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    ours = json.loads(invoke("eval", "--run", run, "--data", tmp_path / "text.txt", "--json"))
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert ours["tokens"] == ids.shape[1] - 1 < 64
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    assert ours["nats_per_token"] == pytest.approx(loss, abs=1e-5)


def test_attribution_parts_sum_to_transformers_logit(imported, theirs):
    _, run = imported
    model, tokenizer = theirs
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    token = int(logits.argmax())
    out = json.loads(invoke("trace", "--run", run, "-p", PROMPT, "--attribute", f"#{token}", "--json"))
    attribution = out["attribution"]
    parts = sum(part["value"] for part in attribution["parts"])
    assert abs(parts - attribution["total"]) < 1e-4
    assert attribution["total"] == pytest.approx(float(logits[token]), abs=1e-4)
    heads = [p["name"] for p in attribution["parts"] if ".head" in p["name"]]
    assert len(heads) == 2 * 6  # a part per query head, in each block


def test_patching_keeps_its_exact_end_points(imported):
    _, run = imported
    clean, corrupt = "ROMEO: what light", "ROMEO: what night"
    pair = ["--clean", clean, "--corrupt", corrupt, "--answer", "#5", "--versus", "#6"]
    out = json.loads(invoke("patch", "--run", run, *pair, "--json"))
    clean_ids, corrupt_ids = out["clean"]["ids"], out["corrupt"]["ids"]
    first = next(i for i, (a, b) in enumerate(zip(clean_ids, corrupt_ids)) if a != b)
    last_block, last = max(e["block"] for e in out["effects"]), len(clean_ids) - 1
    by = {(e["block"], e["stage"], e["position"]): e["effect"] for e in out["effects"]}
    assert by[(last_block, "output", last)] == 1.0
    before = [effect for (_, _, position), effect in by.items() if position < first]
    assert before and all(effect == 0.0 for effect in before)


def test_the_gradient_of_the_loss_at_the_input_is_transformers_autograd(imported, theirs):
    _, run = imported
    model, tokenizer = theirs
    out = json.loads(invoke("trace", "--run", run, "-p", PROMPT, "--grad", "--json"))
    gradient = out["gradient"]
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    rows = model.get_input_embeddings()(ids).detach().requires_grad_(True)  # rope: the input is the token row
    logits = model(inputs_embeds=rows).logits[0, out["position"]]
    loss = -torch.log_softmax(logits, dim=-1)[gradient["target_id"]]
    loss.backward()
    assert gradient["loss"] == pytest.approx(loss.item(), abs=1e-5)
    expected = rows.grad[0, out["position"]]
    assert torch.allclose(torch.tensor(gradient["input"]["row"]), expected, atol=1e-4, rtol=1e-4)


def test_a_fine_tune_and_a_lora_fine_tune_of_it_train(imported, tmp_path):
    _, run = imported
    (tmp_path / "text.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    common = ["--data", tmp_path / "text.txt", "--steps", 3, "--quiet", "--set", "train.batch_size=2"]
    common += ["--set", "train.threads=1", "--set", "train.eval_interval=3"]
    invoke("train", "--init-from", run, "--out", tmp_path / "full", *common)
    invoke("train", "--init-from", run, "--out", tmp_path / "lora", *common, "--set", "train.lora_rank=2")
    for name in ("full", "lora"):
        assert (tmp_path / name / "checkpoint.pt").is_file()
