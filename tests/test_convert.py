"""minigpt.convert: a Hugging Face GPT-2 folder and a nanoGPT checkpoint become minigpt's model,
checked against the libraries that wrote them (transformers' GPT2LMHeadModel, nanoGPT's own
model.py where ../shared/anchors/nanogpt holds it) to 1e-5 in the logits; the export/import round
trip is bitwise; every refusal is one line and leaves nothing behind. Tiny models, no downloads."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from conftest import lazy_module

from minigpt.config import load_config
from minigpt.errors import MinigptError
from minigpt.interchange.convert import Imported, write_run
from minigpt.interchange.hf import read_gpt2_tokenizer, read_hf_gpt2
from minigpt.interchange.nanogpt import read_meta, read_nanogpt
from minigpt.model.gpt import ContextTooLongError, MiniGPT
from minigpt.runs.reading import load_model
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

transformers = lazy_module("transformers")
safetensors_torch = lazy_module("safetensors.torch")

REPO = Path(__file__).resolve().parents[1]
NANOGPT = REPO.parent / "shared" / "anchors" / "nanogpt" / "model.py"
TEXT = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:8000]
EOT = "<|endoftext|>"
SIZE = dict(n_embd=32, n_layer=2, n_head=4)
CONTEXT = 16
PROMPTS = ("R", "First Citizen:", "Before we proceed any further, hear me speak.\nAll: Speak, speak.")
LENGTHS = (1, 5, CONTEXT)  # prompts of one token, a few, the whole position table


def one_line(exc: pytest.ExceptionInfo) -> str:
    """The refusal as the command line says it (the options it names written as flags)."""
    message = exc.value.for_command_line
    assert "\n" not in message and message
    return message


# ---------------------------------------------------------------- a GPT-2 folder, made here


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    """Byte-level BPE fitted to a few KB of the shipped corpus, <|endoftext|> its last id: GPT-2's shape."""
    from tokenizers import AddedToken

    tok = train_tokenizer("bpe", 299, TEXT)
    tok.add_special_tokens([AddedToken(EOT, special=True)])
    assert tok.get_vocab_size() == 300 and tok.token_to_id(EOT) == 299
    return tok


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Weights far from any init: gains near 1, biases and weights of a size where every stage
    (and the choice between the two GELUs) moves the logits by much more than 1e-5."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 and ("ln" in name or "norm" in name) and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def gpt2_model(activation: str = "gelu_new", tie: bool = True, vocab: int = 300, seed: int = 0, **extra):
    cfg = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=CONTEXT,
        activation_function=activation,
        tie_word_embeddings=tie,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        **SIZE,
        **extra,
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    randomise(model, seed)
    if tie:
        assert model.lm_head.weight is model.transformer.wte.weight
    return model


def save_tokenizer(tok, folder: Path, files: str) -> None:
    if files == "tokenizer.json":
        tok.save(str(folder / "tokenizer.json"))
    else:  # GPT-2's original pair: vocab.json (with <|endoftext|>) and merges.txt
        tok.model.save(str(folder))
        (folder / "vocab.json").write_text(json.dumps(tok.get_vocab(), ensure_ascii=False), encoding="utf-8")


def gpt2_folder(folder: Path, model, tok, weights: str = "model.safetensors", tokenizer: str = "tokenizer.json"):
    model.save_pretrained(str(folder))  # config.json and model.safetensors
    if weights == "pytorch_model.bin":  # the older format: a pickled state dict, lm_head included
        (folder / "model.safetensors").unlink()
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    save_tokenizer(tok, folder, tokenizer)
    return folder


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


@pytest.fixture(scope="module")
def folder(tmp_path_factory, gpt2_tokenizer):
    """One GPT-2 folder (gelu_new, tied) that the refusal tests copy and damage."""
    return gpt2_folder(tmp_path_factory.mktemp("gpt2") / "gpt2", gpt2_model(), gpt2_tokenizer)


@pytest.fixture
def copy(folder, tmp_path):
    return Path(shutil.copytree(folder, tmp_path / "copy"))


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return out.logits if hasattr(out, "logits") else out[0]


# ---------------------------------------------------------------- equal to transformers


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("activation, ours", [("gelu_new", "gelu_tanh"), ("gelu", "gelu"), ("relu", "relu")])
@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_imported_gpt2_gives_transformers_logits(tmp_path, gpt2_tokenizer, tie, activation, ours, weights):
    theirs = gpt2_model(activation, tie)
    imported = read_hf_gpt2(gpt2_folder(tmp_path / "hf", theirs, gpt2_tokenizer, weights))
    m = imported.model
    assert (m.n_layer, m.n_head, m.n_embd, m.ffn_hidden, m.context) == (2, 4, 32, 128, CONTEXT)
    assert (m.activation, m.tie_embeddings, m.bias, m.norm_eps, m.dtype) == (ours, tie, True, 1e-5, "float32")
    assert (imported.vocab_size, imported.tokenizer_size, imported.padded) == (300, 300, False)
    model = imported.build()
    assert (model.head.weight is model.token_table.weight) == tie
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "hf" / "tokenizer.json"))
    for prompt in PROMPTS:
        assert imported.tokenizer.encode(prompt) == hf_tokenizer(prompt)["input_ids"]  # transformers' ids
    ids = imported.tokenizer.encode(PROMPTS[2])
    for T in LENGTHS:
        assert (logits_of(model, ids[:T]) - logits_of(theirs, ids[:T])).abs().max() <= 1e-5


def test_the_two_gelus_are_told_apart_by_the_logits(tmp_path, gpt2_tokenizer):
    """The test above would catch a GELU imported as the other: here they differ by far more than 1e-5."""
    imported = read_hf_gpt2(gpt2_folder(tmp_path / "hf", gpt2_model("gelu_new"), gpt2_tokenizer))
    tanh = imported.build()
    exact = MiniGPT(dataclasses.replace(imported.model, activation="gelu"), 300).eval()
    exact.load_state_dict(imported.state)
    ids = imported.tokenizer.encode(PROMPTS[2])[:CONTEXT]
    assert (logits_of(tanh, ids) - logits_of(exact, ids)).abs().max() > 1e-3


def test_gpt2_s_own_layout_unprefixed_with_mask_buffers_imports_the_same(tmp_path, folder, gpt2_tokenizer):
    """OpenAI's upload names tensors without `transformer.` and keeps each block's causal mask
    (attn.bias, attn.masked_bias) as buffers: the buffers are not parameters and are left out."""
    tensors = {
        k.removeprefix("transformer."): v
        for k, v in safetensors_torch.load_file(str(folder / "model.safetensors")).items()
    }
    for i in range(SIZE["n_layer"]):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool)).view(1, 1, 16, 16)
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    other = Path(shutil.copytree(folder, tmp_path / "openai"))
    safetensors_torch.save_file(tensors, str(other / "model.safetensors"))
    plain, openai = read_hf_gpt2(folder), read_hf_gpt2(other)
    assert set(plain.state) == set(openai.state)
    assert all(torch.equal(plain.state[k], openai.state[k]) for k in plain.state)


def test_half_precision_weights_widen_to_float32_exactly(tmp_path, folder):
    tensors = {k: v.half() for k, v in safetensors_torch.load_file(str(folder / "model.safetensors")).items()}
    half = Path(shutil.copytree(folder, tmp_path / "half"))
    safetensors_torch.save_file(tensors, str(half / "model.safetensors"))
    imported = read_hf_gpt2(half)
    assert imported.model.dtype == "float32" and imported.origin["weights_dtype"] == "float16"
    assert torch.equal(imported.state["token_table.weight"], tensors["transformer.wte.weight"].float())


def test_vocab_and_merges_give_the_ids_tokenizer_json_gives(tmp_path, gpt2_tokenizer):
    for files in ("tokenizer.json", "vocab.json + merges.txt"):
        (tmp_path / files).mkdir()
        save_tokenizer(gpt2_tokenizer, tmp_path / files, files)
    from_json, _ = read_gpt2_tokenizer(tmp_path / "tokenizer.json")
    from_pair, described = read_gpt2_tokenizer(tmp_path / "vocab.json + merges.txt")
    assert described == "vocab.json + merges.txt" and from_pair.vocab_size == from_json.vocab_size == 300
    text = f"First Citizen:\n  Before we proceed{EOT}any further, ça va? 🙂\n"
    assert from_pair.encode(text) == from_json.encode(text) == gpt2_tokenizer.encode(text).ids
    assert 299 in from_pair.encode(text)  # <|endoftext|> is one special id, not its characters
    assert from_pair.token_text(299) == EOT and from_pair.decode(from_pair.encode(text)) == text


def test_context_crops_the_position_table_to_its_first_rows(folder):
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    imported = read_hf_gpt2(folder, context=5)
    assert imported.model.context == 5 and imported.origin["position_rows"] == CONTEXT
    assert torch.equal(imported.state["position_table.weight"], theirs.transformer.wpe.weight[:5])
    model = imported.build()
    ids = imported.tokenizer.encode(PROMPTS[2])
    assert (logits_of(model, ids[:5]) - logits_of(theirs, ids[:5])).abs().max() <= 1e-5
    with pytest.raises(ContextTooLongError, match="the position table has 5 rows"):
        model(torch.tensor([ids[:6]]))


# ---------------------------------------------------------------- round trip


@pytest.mark.parametrize("kind", ["bpe", "char", "byte"])
@pytest.mark.parametrize("tie", [True, False])
def test_export_then_import_gives_back_the_same_weights_bitwise_and_the_same_ids(tmp_path, kind, tie):
    from minigpt.config import ModelConfig
    from minigpt.interchange.export import export_hf

    tokenizer = TextTokenizer(train_tokenizer(kind, 300, TEXT))
    cfg = ModelConfig(context=CONTEXT, **SIZE, ffn_hidden=48, activation="gelu_tanh", tie_embeddings=tie, norm_eps=1e-6)
    torch.manual_seed(0)
    model = MiniGPT(cfg, tokenizer.vocab_size).eval()
    randomise(model, 1)
    export_hf(model, tokenizer, tmp_path / "hf")
    back = read_hf_gpt2(tmp_path / "hf")
    assert back.model == cfg and back.vocab_size == tokenizer.vocab_size
    ours = model.state_dict()
    assert set(back.state) == set(ours)
    for name, tensor in ours.items():
        assert back.state[name].dtype == tensor.dtype and torch.equal(back.state[name], tensor), name
    assert back.tokenizer.to_str() == tokenizer.to_str()
    for text in (TEXT[:300], "Ωmega ∑ 🦙" if kind != "char" else "ROMEO:"):
        assert back.tokenizer.encode(text) == tokenizer.encode(text)


# ---------------------------------------------------------------- the run folder


def test_an_imported_run_loads_samples_its_logits_and_traces(tmp_path, folder):
    from minigpt.inspection.trace import trace_position

    imported = read_hf_gpt2(folder)
    cfg = write_run(imported, tmp_path / "runs" / "gpt2")
    run = tmp_path / "runs" / "gpt2"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.toml", "origin.json", "tokenizer.json"]
    assert list((tmp_path / "runs").iterdir()) == [run]  # no temporary left beside it
    saved = load_config(run / "config.toml")
    assert saved.model == imported.model and (saved.tokenizer.kind, saved.tokenizer.vocab_size) == ("imported", 300)
    assert saved.train.out == str(run.resolve()) and cfg.model == saved.model
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    assert payload["origin"]["kind"] == "hf-gpt2" and payload["origin"]["path"] == str(folder.resolve())
    assert json.loads((run / "origin.json").read_text(encoding="utf-8")) == payload["origin"]
    assert len(payload["origin"]["sha256"]) == 64 and "tokenizer_size" not in payload  # not padded
    model, tokenizer = load_model(saved, run)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    ids = tokenizer.encode(PROMPTS[1])
    assert (logits_of(model, ids) - logits_of(theirs, ids)).abs().max() <= 1e-5
    trace = trace_position(model, tokenizer, ids)
    assert trace.model["activation"] == "gelu_tanh" and len(trace.blocks) == SIZE["n_layer"]
    assert abs(sum(trace.probabilities) - 1) < 1e-9


def test_an_existing_out_is_refused_without_force_and_replaced_with_it(tmp_path, folder):
    imported = read_hf_gpt2(folder)
    out = tmp_path / "run"
    write_run(imported, out)
    (out / "checkpoint.pt").write_bytes(b"an older run")
    with pytest.raises(MinigptError) as refused:
        write_run(imported, out)
    assert "already holds a run; pass --force to replace it" in one_line(refused)
    assert (out / "checkpoint.pt").read_bytes() == b"an older run"
    write_run(imported, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "config.toml", "origin.json", "tokenizer.json"]
    assert (out / "checkpoint.pt").read_bytes() != b"an older run"
    (out / "keep.txt").write_text("mine")  # not a run's: --force replaces a run and nothing else
    with pytest.raises(MinigptError) as refused:
        write_run(imported, out, force=True)
    assert "holds keep.txt, which no run writes" in one_line(refused)
    assert (out / "keep.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(MinigptError, match="is a file"):
        write_run(imported, tmp_path / "file")


def test_a_failed_write_leaves_nothing_behind_and_the_old_run_intact(tmp_path, folder, monkeypatch):
    import errno

    from minigpt.runs import folder as run_folder

    imported = read_hf_gpt2(folder)
    old = tmp_path / "old"
    write_run(imported, old)
    before = {p.name: p.read_bytes() for p in old.iterdir()}

    def full_disk(path, payload):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_folder, "save_checkpoint", full_disk)
    with pytest.raises(MinigptError) as refused:
        write_run(imported, tmp_path / "new" / "deeper" / "run")
    assert "No space left on device" in one_line(refused)
    assert [p.name for p in tmp_path.iterdir()] == ["old"]  # not the run, not the folders above it, no temporary
    with pytest.raises(MinigptError) as refused:
        write_run(imported, old, force=True)
    assert "and the run it was to replace is intact" in one_line(refused)
    assert [p.name for p in tmp_path.iterdir()] == ["old"] and {p.name: p.read_bytes() for p in old.iterdir()} == before


def test_what_does_not_fit_in_memory_is_refused_before_it_is_read(tmp_path, folder, monkeypatch):
    from minigpt import memory
    from minigpt.interchange import hf

    imported = read_hf_gpt2(folder)
    write_run(imported, tmp_path / "run")
    monkeypatch.setattr(memory, "available_memory", lambda device: 1 << 20)
    monkeypatch.setattr(hf, "_safetensors_load", lambda path: pytest.fail("read before the memory check"))
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(folder)
    assert "importing this model (" in one_line(refused) and "but cpu has 0.00 GiB available" in str(refused.value)
    with pytest.raises(MinigptError) as refused:
        load_model(load_config(tmp_path / "run" / "config.toml"), tmp_path / "run")
    assert "loading this model" in one_line(refused)


# ---------------------------------------------------------------- refusals: the folder


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"model_type": "llama"}, 'model_type = "llama" is not "gpt2"'),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx = true"),
        ({"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn = true"),
        ({"add_cross_attention": True}, "add_cross_attention = true"),
        ({"scale_attn_weights": False}, "scale_attn_weights = false"),
        ({"activation_function": "gelu_fast"}, 'activation_function = "gelu_fast" is not one minigpt computes'),
        ({"n_head": 5}, "n_embd = 32 is not divisible by n_head = 5"),
        ({"n_layer": 0}, "n_layer = 0 is not an integer of at least 1"),
        ({"n_inner": "wide"}, 'n_inner = "wide" is not an integer'),
        ({"layer_norm_epsilon": -1}, "layer_norm_epsilon = -1 is not a positive number"),
        ({"hidden_size": 64}, "n_embd = 32 and hidden_size = 64 disagree"),
        ({"tie_word_embeddings": "yes"}, 'tie_word_embeddings = "yes" is not true or false'),
    ],
)
def test_what_minigpt_cannot_compute_is_refused_naming_the_key(copy, changes, words):
    edit_config(copy, **changes)
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert words in one_line(refused)


def test_a_missing_or_foreign_folder_is_refused(tmp_path, copy):
    with pytest.raises(MinigptError, match="is not a folder"):
        read_hf_gpt2(tmp_path / "absent")
    (tmp_path / "file").write_text("x")
    with pytest.raises(MinigptError, match="is not a folder"):
        read_hf_gpt2(tmp_path / "file")
    (copy / "config.json").write_text("{not json")
    with pytest.raises(MinigptError, match="is not valid JSON"):
        read_hf_gpt2(copy)
    (copy / "config.json").write_text("[1, 2]")
    with pytest.raises(MinigptError, match="holds a JSON list, not an object"):
        read_hf_gpt2(copy)
    (copy / "config.json").write_text("{}")
    with pytest.raises(MinigptError, match="has no model_type"):
        read_hf_gpt2(copy)
    (copy / "config.json").unlink()
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert "has no config.json" in one_line(refused)


def test_missing_truncated_or_damaged_weights_are_refused(copy):
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert "could not be read as safetensors" in one_line(refused) and "truncated or damaged" in str(refused.value)
    (copy / "model.safetensors").unlink()
    with pytest.raises(MinigptError, match="has no model.safetensors or pytorch_model.bin"):
        read_hf_gpt2(copy)
    buffer = io.BytesIO()
    torch.save(load_file_from(data), buffer)
    (copy / "pytorch_model.bin").write_bytes(buffer.getvalue()[:-100])
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert "could not be read as a PyTorch file" in one_line(refused)
    (copy / "pytorch_model.bin").write_bytes(b"\x80\x04garbage" * 10)
    with pytest.raises(MinigptError, match="could not be read as a PyTorch file"):
        read_hf_gpt2(copy)


def load_file_from(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(data)


class WritesAFile:
    """A pickle payload that, if it ever ran, would create `path`."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_weights_file_that_would_run_code_is_refused_unrun(tmp_path, copy):
    marker = tmp_path / "ran"
    tensors = safetensors_torch.load_file(str(copy / "model.safetensors"))
    (copy / "model.safetensors").unlink()
    torch.save({**tensors, "payload": WritesAFile(marker)}, copy / "pytorch_model.bin")
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert "refused without being run" in one_line(refused) and "weights_only=False" not in str(refused.value)
    assert not marker.exists()


def rewrite(folder: Path, change) -> None:
    tensors = safetensors_torch.load_file(str(folder / "model.safetensors"))
    change(tensors)
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"), "lacks transformer.h.1.mlp.c_fc.bias"),
        (lambda t: t.update(extra=torch.zeros(3)), "holds extra, which no part of the config's model reads"),
        (lambda t: t.update({"score.weight": torch.zeros(2, 32)}), "holds score.weight"),
        (
            lambda t: t.update({"transformer.h.0.attn.c_attn.weight": torch.zeros(96, 32)}),
            "transformer.h.0.attn.c_attn.weight has shape [96, 32] but the config's model needs [32, 96]",
        ),
        (lambda t: t["transformer.wte.weight"].__setitem__((3, 4), float("nan")), "holds NaN or infinite values"),
        (
            lambda t: t.update({"lm_head.weight": t["transformer.wte.weight"] + 1}),
            "lm_head.weight differs from transformer.wte.weight",
        ),
        (lambda t: t.update({"transformer.wpe.weight": t["transformer.wpe.weight"].long()}), "float32, int64 tensors"),
    ],
)
def test_a_missing_extra_or_misshapen_tensor_is_refused_naming_it(copy, change, words):
    rewrite(copy, change)
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert words in one_line(refused)


def test_an_untied_config_needs_its_head(copy):
    edit_config(copy, tie_word_embeddings=False)
    with pytest.raises(MinigptError, match="lacks lm_head.weight"):
        read_hf_gpt2(copy)


def test_a_tokenizer_that_is_not_the_weights_one_is_refused(copy, tmp_path):
    bigger = train_tokenizer("bpe", 400, TEXT)
    bigger.save(str(copy / "tokenizer.json"))
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert "writes 400 ids but the weights have 300 rows" in one_line(refused)
    train_tokenizer("char", 0, TEXT).save(str(copy / "tokenizer.json"))
    with pytest.raises(MinigptError, match="more than padding"):
        read_hf_gpt2(copy)
    (copy / "tokenizer.json").write_text("{broken")
    with pytest.raises(MinigptError, match="could not be read as a tokenizer"):
        read_hf_gpt2(copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert "holds no tokenizer: neither tokenizer.json nor vocab.json + merges.txt" in one_line(refused)
    (copy / "vocab.json").write_text("{}")
    with pytest.raises(MinigptError, match="has no merges.txt"):
        read_hf_gpt2(copy)


def test_a_tokenizer_minigpt_cannot_read_exactly_is_refused(copy):
    from tokenizers import Tokenizer, models, pre_tokenizers

    word_piece = Tokenizer(models.WordPiece({f"w{i}": i for i in range(300)}, unk_token="w0"))
    word_piece.pre_tokenizer = pre_tokenizers.Whitespace()
    word_piece.save(str(copy / "tokenizer.json"))
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(copy)
    assert "is a WordPiece tokenizer" in one_line(refused)


@pytest.mark.parametrize("context", [0, -3, CONTEXT + 1, True, 2.5])
def test_a_context_outside_the_position_table_is_refused(folder, context):
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(folder, context=context)
    assert f"--context {context}: the position table has {CONTEXT} rows" in one_line(refused)
    assert f"1 .. {CONTEXT}" in str(refused.value)


def test_without_safetensors_the_message_says_what_to_install(folder, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if it were not installed
    with pytest.raises(MinigptError) as refused:
        read_hf_gpt2(folder)
    assert 'pip install "minigpt[export]"' in one_line(refused)


# ---------------------------------------------------------------- nanoGPT


def nanogpt_state(n_layer: int, n_embd: int, rows: int, vocab: int, bias: bool, seed: int) -> dict[str, torch.Tensor]:
    """A nanoGPT state dict built with plain torch: GPT-2's names, nn.Linear's [out, in] layout,
    lm_head the very tensor wte is (nanoGPT ties them)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return 0.3 * torch.randn(*shape, generator=g)

    def gain(n):
        return 1 + 0.2 * torch.randn(n, generator=g)

    C = n_embd
    state = {"transformer.wte.weight": w(vocab, C), "transformer.wpe.weight": w(rows, C)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        state.update({p + "ln_1.weight": gain(C), p + "attn.c_attn.weight": w(3 * C, C)})
        state.update({p + "attn.c_proj.weight": w(C, C), p + "ln_2.weight": gain(C)})
        state.update({p + "mlp.c_fc.weight": w(4 * C, C), p + "mlp.c_proj.weight": w(C, 4 * C)})
        if bias:
            for name, n in (("ln_1", C), ("attn.c_attn", 3 * C), ("attn.c_proj", C), ("ln_2", C)):
                state[p + name + ".bias"] = w(n)
            state.update({p + "mlp.c_fc.bias": w(4 * C), p + "mlp.c_proj.bias": w(C)})
    state["transformer.ln_f.weight"] = gain(C)
    if bias:
        state["transformer.ln_f.bias"] = w(C)
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def save_ckpt(path: Path, state, model_args: dict, compiled: bool = False) -> Path:
    """As nanoGPT's train.py saves it (torch.compile's wrapper prefixes every name with _orig_mod.)."""
    if compiled:
        state = {"_orig_mod." + k: v for k, v in state.items()}
    checkpoint = {
        "model": state,
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": [{"lr": 6e-4, "params": [0]}]},
        "model_args": model_args,
        "iter_num": 250,
        "best_val_loss": torch.tensor(1.4697),
        "config": {"dataset": "shakespeare_char", "batch_size": 64, "compile": compiled, "dtype": "bfloat16"},
    }
    torch.save(checkpoint, path)
    return path


def write_meta(path: Path, chars: str) -> Path:
    stoi = {c: i for i, c in enumerate(sorted(set(chars)))}
    with open(path, "wb") as f:
        pickle.dump({"vocab_size": len(stoi), "itos": {i: c for c, i in stoi.items()}, "stoi": stoi}, f)
    return path


def reference_nanogpt_logits(state: dict[str, torch.Tensor], ids: list[int], n_head: int) -> torch.Tensor:
    """nanoGPT's forward written out here, in its own layout, independently of minigpt's code."""
    import torch.nn.functional as F

    s = {k.removeprefix("_orig_mod."): v.double() for k, v in state.items()}

    def ln(x, name):
        return F.layer_norm(x, x.shape[-1:], s[name + ".weight"], s.get(name + ".bias"), 1e-5)

    def lin(x, name):
        return F.linear(x, s[name + ".weight"], s.get(name + ".bias"))

    T = len(ids)
    x = s["transformer.wte.weight"][ids] + s["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    i = 0
    while f"transformer.h.{i}.ln_1.weight" in s:
        p = f"transformer.h.{i}."
        q, k, v = lin(ln(x, p + "ln_1"), p + "attn.c_attn").split(x.shape[-1], dim=-1)
        heads = [t.view(T, n_head, -1).transpose(0, 1) for t in (q, k, v)]
        scores = (heads[0] @ heads[1].transpose(-1, -2)) / heads[0].shape[-1] ** 0.5
        mixed = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ heads[2]
        x = x + lin(mixed.transpose(0, 1).reshape(T, -1), p + "attn.c_proj")
        x = x + lin(F.gelu(lin(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
        i += 1
    return ln(x, "transformer.ln_f") @ s["lm_head.weight"].T


def nanogpt_module():
    """nanoGPT's own model.py (MIT), read from ../shared/anchors where this checkout has it."""
    if not NANOGPT.is_file():
        return None
    spec = importlib.util.spec_from_file_location("nanogpt_model", NANOGPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHARS = sorted(set(TEXT))  # fewer than 64 characters


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("rows", [len(CHARS), 64])  # exact, or padded to a multiple of 64 as nanoGPT pads
def test_nanogpt_checkpoint_gives_nanogpt_s_logits(tmp_path, bias, compiled, rows):
    args = dict(n_layer=2, n_head=4, n_embd=32, block_size=CONTEXT, bias=bias, vocab_size=rows, dropout=0.0)
    state = nanogpt_state(2, 32, CONTEXT, rows, bias, seed=3)
    ckpt = save_ckpt(tmp_path / "ckpt.pt", state, args, compiled)
    imported = read_nanogpt(ckpt, meta=write_meta(tmp_path / "meta.pkl", TEXT))
    m = imported.model
    assert (m.activation, m.bias, m.tie_embeddings, m.norm_eps, m.ffn_hidden, m.context) == (
        "gelu",
        bias,
        True,
        1e-5,
        128,
        CONTEXT,
    )
    assert (imported.vocab_size, imported.tokenizer_size, imported.padded) == (rows, len(CHARS), rows > len(CHARS))
    assert imported.origin["kind"] == "nanogpt" and imported.origin["iter_num"] == 250
    assert torch.equal(imported.state["token_table.weight"], state["transformer.wte.weight"])  # padded rows kept
    model = imported.build()
    ids = imported.tokenizer.encode(PROMPTS[2])[:CONTEXT]
    ours = logits_of(model, ids)[0]
    for T in (1, 5, CONTEXT):
        assert (ours[:T] - logits_of(model, ids[:T])[0]).abs().max() <= 1e-5  # causal: a prefix's logits
    assert (ours.double() - reference_nanogpt_logits(state, ids, 4)).abs().max() <= 1e-5
    nanogpt = nanogpt_module()
    if nanogpt is not None:  # nanoGPT's own code, where this checkout has it
        theirs = nanogpt.GPT(nanogpt.GPTConfig(**args)).eval()
        theirs.load_state_dict(state)
        for T in (1, 5, CONTEXT):
            with torch.no_grad():
                logits, _ = theirs(torch.tensor([ids[:T]]), targets=torch.tensor([ids[:T]]))  # every position
            assert (logits_of(model, ids[:T]) - logits).abs().max() <= 1e-5


def test_a_checkpoint_of_nanogpt_s_own_model_imports(tmp_path):
    nanogpt = nanogpt_module()
    if nanogpt is None:
        pytest.skip(f"nanoGPT's model.py is not at {NANOGPT}")
    args = dict(n_layer=2, n_head=4, n_embd=32, block_size=CONTEXT, bias=True, vocab_size=64, dropout=0.0)
    torch.manual_seed(0)
    theirs = nanogpt.GPT(nanogpt.GPTConfig(**args)).eval()
    randomise(theirs, 5)
    ckpt = save_ckpt(tmp_path / "ckpt.pt", theirs.state_dict(), args)
    model = read_nanogpt(ckpt, meta=write_meta(tmp_path / "meta.pkl", TEXT)).build()
    ids = list(range(0, 60, 4))
    with torch.no_grad():
        logits, _ = theirs(torch.tensor([ids]), targets=torch.tensor([ids]))
    assert (logits_of(model, ids) - logits).abs().max() <= 1e-5


def test_meta_pkl_ids_are_stoi_s_exactly(tmp_path):
    stoi = {c: i for i, c in enumerate(reversed(CHARS))}  # not sorted: the ids must still be these
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(stoi), "itos": {i: c for c, i in stoi.items()}, "stoi": stoi}, f)
    tokenizer = read_meta(tmp_path / "meta.pkl")
    assert tokenizer.vocab_size == len(stoi)
    assert [tokenizer.encode(c) for c in stoi] == [[i] for i in stoi.values()]
    assert tokenizer.decode(tokenizer.encode(TEXT[:500])) == TEXT[:500]


class RunsAShell:
    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("payload", [WritesAFile, RunsAShell])
def test_a_malicious_meta_pkl_never_runs(tmp_path, payload):
    marker = tmp_path / "ran"
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 2, "stoi": {"a": 0, "b": 1}, "itos": {0: "a", 1: "b"}, "x": payload(marker)}, f)
    with pytest.raises(MinigptError) as refused:
        read_meta(tmp_path / "meta.pkl")
    assert "not plain data, so it is refused without being run" in one_line(refused)
    assert (".open," if payload is WritesAFile else ".system,") in str(refused.value)  # io.open, posix.system
    assert not marker.exists()


@pytest.mark.parametrize(
    "meta, words",
    [
        ({"vocab_size": 2, "stoi": {"a": 0, "b": 1}, "itos": {0: "a", 1: "b"}, "scale": 0.5}, "holds a float"),
        ({"vocab_size": 2, "stoi": {"a": 0, "b": 1}, "itos": {0: "a", 1: "b"}, "s": {1, 2}}, "holds a set"),
        ({"vocab_size": 2, "stoi": {"a": 0, "b": 1}}, "is not nanoGPT's char-level meta.pkl"),
        ({"vocab_size": 3, "stoi": {"a": 0, "b": 1}, "itos": {0: "a", 1: "b"}}, "vocab_size = 3 but stoi has 2"),
        ({"vocab_size": 2, "stoi": {"a": 0, "b": 2}, "itos": {0: "a", 2: "b"}}, "ids are not 0 .. 1 each once"),
        ({"vocab_size": 2, "stoi": {"a": 0, "bc": 1}, "itos": {0: "a", 1: "bc"}}, "not a dict from single characters"),
        ({"vocab_size": 2, "stoi": {"a": 0, "b": 1}, "itos": {0: "b", 1: "a"}}, "itos is not the inverse of stoi"),
    ],
)
def test_a_meta_pkl_of_anything_but_a_character_table_is_refused(tmp_path, meta, words):
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(MinigptError) as refused:
        read_meta(tmp_path / "meta.pkl")
    assert words in one_line(refused)


def test_a_damaged_or_missing_meta_pkl_is_refused(tmp_path):
    with pytest.raises(MinigptError, match="no such file"):
        read_meta(tmp_path / "meta.pkl")
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"stoi": {}})[:-3])
    with pytest.raises(MinigptError) as refused:
        read_meta(tmp_path / "meta.pkl")
    assert "is not a readable pickle" in one_line(refused)


@pytest.fixture
def char_ckpt(tmp_path):
    args = dict(n_layer=2, n_head=4, n_embd=32, block_size=CONTEXT, bias=True, vocab_size=64, dropout=0.0)
    return save_ckpt(tmp_path / "ckpt.pt", nanogpt_state(2, 32, CONTEXT, 64, True, 0), args), write_meta(
        tmp_path / "meta.pkl", TEXT
    )


def test_a_padded_nanogpt_run_loads_and_never_names_a_padded_id_as_text(tmp_path, char_ckpt):
    from minigpt.inspection.trace import trace_position

    ckpt, meta = char_ckpt
    write_run(read_nanogpt(tmp_path, meta=meta), tmp_path / "run")  # the out folder holding ckpt.pt
    payload = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert (payload["vocab_size"], payload["tokenizer_size"]) == (64, len(CHARS))
    cfg = load_config(tmp_path / "run" / "config.toml")
    assert (cfg.tokenizer.kind, cfg.tokenizer.vocab_size) == ("imported", len(CHARS))
    model, tokenizer = load_model(cfg, tmp_path / "run")
    assert (model.vocab_size, tokenizer.vocab_size) == (64, len(CHARS))  # ids len(CHARS) .. 63 are padding
    trace = trace_position(model, tokenizer, tokenizer.encode("ROMEO:"), top=64)
    padded = [c for c in trace.next_tokens if c.id >= tokenizer.vocab_size]
    assert len(padded) == 64 - len(CHARS) and all(c.token == f"<pad {c.id}>" for c in padded)
    (tmp_path / "run" / "tokenizer.json").write_text(TextTokenizer(train_tokenizer("char", 0, "abc")).to_str())
    with pytest.raises(MinigptError) as refused:
        load_model(cfg, tmp_path / "run")
    assert f"has 3 tokens but the checkpoint expects {len(CHARS)} (of its 64 rows)" in one_line(refused)


def test_a_nanogpt_bpe_checkpoint_takes_a_gpt2_tokenizer_folder(tmp_path, gpt2_tokenizer):
    (tmp_path / "tok").mkdir()
    save_tokenizer(gpt2_tokenizer, tmp_path / "tok", "vocab.json + merges.txt")
    args = dict(n_layer=1, n_head=4, n_embd=32, block_size=CONTEXT, bias=False, vocab_size=320, dropout=0.0)
    ckpt = save_ckpt(tmp_path / "ckpt.pt", nanogpt_state(1, 32, CONTEXT, 320, False, 1), args)
    imported = read_nanogpt(ckpt, tokenizer_dir=tmp_path / "tok", context=8)
    assert (imported.vocab_size, imported.tokenizer_size, imported.model.context) == (320, 300, 8)
    assert imported.tokenizer.encode(f"hear me{EOT}") == gpt2_tokenizer.encode(f"hear me{EOT}").ids


def test_nanogpt_refusals_are_one_line(tmp_path, char_ckpt):
    ckpt, meta = char_ckpt
    with pytest.raises(MinigptError) as refused:
        read_nanogpt(ckpt)
    assert "holds no tokenizer: pass exactly one of --meta" in one_line(refused)
    with pytest.raises(MinigptError, match="exactly one of"):
        read_nanogpt(ckpt, meta=meta, tokenizer_dir=tmp_path)
    with pytest.raises(MinigptError, match="no such file"):
        read_nanogpt(tmp_path / "absent.pt", meta=meta)
    with pytest.raises(MinigptError) as refused:
        read_nanogpt(ckpt, meta=meta, context=CONTEXT + 1)
    assert f"--context {CONTEXT + 1}: the position table has {CONTEXT} rows" in one_line(refused)
    larger = write_meta(tmp_path / "larger.pkl", "".join(chr(c) for c in range(33, 103)))
    with pytest.raises(MinigptError, match="writes 70 ids but the weights have 64 rows"):
        read_nanogpt(ckpt, meta=larger)

    payload = torch.load(ckpt, weights_only=True)
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(ckpt.read_bytes()[:-200])
    with pytest.raises(MinigptError) as refused:
        read_nanogpt(damaged, meta=meta)
    assert "could not be read as a PyTorch file; it is truncated or damaged" in one_line(refused)
    marker = tmp_path / "ran"
    torch.save({**payload, "evil": WritesAFile(marker)}, tmp_path / "evil.pt")
    with pytest.raises(MinigptError, match="refused without being run"):
        read_nanogpt(tmp_path / "evil.pt", meta=meta)
    assert not marker.exists()
    torch.save({**payload, "model_args": {**payload["model_args"], "n_kv_head": 2}}, tmp_path / "fork.pt")
    with pytest.raises(MinigptError, match="model_args has n_kv_head, which nanoGPT's GPTConfig does not"):
        read_nanogpt(tmp_path / "fork.pt", meta=meta)
    torch.save({"format": 1, "model": {}, "model_config": {}}, tmp_path / "minigpt.pt")
    with pytest.raises(MinigptError, match="is not a nanoGPT checkpoint .* a minigpt checkpoint"):
        read_nanogpt(tmp_path / "minigpt.pt", meta=meta)
    state = dict(payload["model"])
    state["transformer.h.0.attn.c_attn.weight"] = state["transformer.h.0.attn.c_attn.weight"].T.contiguous()
    torch.save({**payload, "model": state}, tmp_path / "shape.pt")
    with pytest.raises(MinigptError, match=r"c_attn.weight has shape \[32, 96\] but the config's model needs \[96"):
        read_nanogpt(tmp_path / "shape.pt", meta=meta)


def test_an_untied_nanogpt_head_is_kept_as_its_own(tmp_path):
    args = dict(n_layer=1, n_head=4, n_embd=32, block_size=CONTEXT, bias=True, vocab_size=64, dropout=0.0)
    state = nanogpt_state(1, 32, CONTEXT, 64, True, 2)
    state["lm_head.weight"] = state["lm_head.weight"] * 0.5
    imported = read_nanogpt(save_ckpt(tmp_path / "ckpt.pt", state, args), meta=write_meta(tmp_path / "m.pkl", TEXT))
    assert not imported.model.tie_embeddings
    assert torch.equal(imported.state["head.weight"], state["lm_head.weight"])
    ids = imported.tokenizer.encode("ROMEO:")
    assert (logits_of(imported.build(), ids)[0].double() - reference_nanogpt_logits(state, ids, 4)).abs().max() <= 1e-5


def test_imported_holds_what_write_run_and_build_need():
    fields = {"model", "vocab_size", "state", "tokenizer", "tokenizer_size", "origin"}
    assert set(Imported.__dataclass_fields__) == fields


def test_a_run_folder_a_train_is_writing_is_not_replaced(tmp_path, folder):
    from minigpt.runs.lock import RunLock

    imported = read_hf_gpt2(folder)
    write_run(imported, tmp_path / "run")
    lock = RunLock(tmp_path / "run").acquire()  # as a `minigpt train` on that folder holds it
    try:
        with pytest.raises(MinigptError) as refused:
            write_run(imported, tmp_path / "run", force=True)
        assert "is being written by another training run" in one_line(refused)
    finally:
        lock.release()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "checkpoint.pt",
        "config.toml",
        "origin.json",
        "tokenizer.json",
    ]


def test_reading_reports_its_progress_to_the_caller(folder):
    from contextlib import contextmanager

    told = []

    @contextmanager
    def progress(label, total):
        done = []
        yield done.append
        told.append((label, total, sum(done)))

    read_hf_gpt2(folder, progress=progress)
    size = (folder / "model.safetensors").stat().st_size
    tensors = 4 + 12 * SIZE["n_layer"]  # wte, wpe, ln_f (2); 12 per block; the tied head is wte
    assert told == [
        ("hashing model.safetensors", size, size),
        ("reading model.safetensors", 1, 1),
        ("converting the weights", tensors, tensors),
    ]


def test_a_checkpoint_records_the_tokenizer_s_ids_only_when_the_model_has_more_rows():
    from minigpt.config import Config, ModelConfig, SampleConfig, TokenizerConfig, TrainConfig
    from minigpt.runs.checkpoints import model_payload, tokenizer_size

    cfg = Config(
        ModelConfig(context=4, n_layer=1, n_head=1, n_embd=4, ffn_hidden=8),
        TokenizerConfig(),
        TrainConfig(),
        SampleConfig(),
    )
    model = MiniGPT(cfg.model, 72)
    padded, plain = model_payload(cfg, model, tokenizer_size=65), model_payload(cfg, model)
    assert (padded["vocab_size"], padded["tokenizer_size"], tokenizer_size(padded)) == (72, 65, 65)
    assert "tokenizer_size" not in plain and tokenizer_size(plain) == 72
    assert "tokenizer_size" not in model_payload(cfg, model, tokenizer_size=72)
