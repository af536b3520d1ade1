"""[train] precision: bfloat16 autocast is the fast path where the CPU (or GPU) runs it natively;
weights stay float32, and after the same steps its validation loss is within 1% of float32's."""

from __future__ import annotations

import pytest
import torch

from minigpt import device as device_module
from minigpt.config import load_config
from minigpt.device import pick_precision
from minigpt.errors import MinigptError
from minigpt.text.corpus import load_corpus
from minigpt.training.session import build
from minigpt.training.trainer import Trainer, evaluate

# As the tiny config says (threads = 1): tiny matmuls only lose from a second thread (conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


def trained(config, precision: str, steps: int = 80):
    cfg = load_config(
        config,
        [
            f'train.precision="{precision}"',
            f"train.steps={steps}",
            "model.n_embd=32",
            "model.ffn_hidden=64",
            "model.n_layer=2",
            "model.context=16",
            "train.batch_size=16",
            f"train.eval_interval={steps}",
            "train.eval_batches=8",
        ],
    )
    session = build(cfg, load_corpus(cfg))
    result = Trainer(session).run()
    return session, result


def test_bfloat16_path_ends_within_one_percent_of_float32(tiny_config):
    fast, fast_result = trained(tiny_config, "bfloat16")
    reference, reference_result = trained(tiny_config, "float32")
    assert fast.precision == "bfloat16" and reference.precision == "float32"
    assert all(p.dtype == torch.float32 for p in fast.model.parameters())  # master weights stay float32
    # Both evaluated the same way (float32 forward on the same fixed windows).
    assert fast_result.val_loss == pytest.approx(reference_result.val_loss, rel=0.01)
    assert reference_result.val_loss < 3.3  # both really learned: ln(vocab of ~60 chars) is about 4.1
    again = evaluate(fast.model, fast.val_windows, fast.corpus.val_tokens_per_byte)["val_loss"]
    assert again == fast_result.val_loss


def test_autocast_attention_matches_the_fused_float32_attention(tiny_config):
    cfg = load_config(tiny_config)
    session = build(cfg, load_corpus(cfg))
    x, y = session.val_windows[0]
    model = session.model.eval()
    with torch.no_grad():
        reference, _ = model(x, y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lowered, loss = model(x, y)
    assert loss.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: agreement to a couple of percent of the logits' spread
    assert (lowered.float() - reference).abs().max() < 0.05 * reference.std()


def test_auto_picks_bfloat16_only_where_it_is_native(monkeypatch):
    monkeypatch.setattr(device_module, "native_bfloat16", lambda device: True)
    assert pick_precision("auto", "cpu", "float32") == "bfloat16"
    monkeypatch.setattr(device_module, "native_bfloat16", lambda device: False)
    assert pick_precision("auto", "cpu", "float32") == "float32"
    assert pick_precision("float32", "cpu", "float32") == "float32"
    assert pick_precision("bfloat16", "cpu", "float32") == "bfloat16"  # asked for: emulated if need be
    assert pick_precision("auto", "cpu", "float64") == "float64"  # teaching runs stay exact


# The detector, each of its branches on every machine: torch's flags (AVX-512 BF16, AMX, both,
# neither), /proc/cpuinfo where torch gives none, and the override that tells it the CPU's kind.
@pytest.mark.parametrize(
    "flags, native",
    [
        ({"avx512_bf16": True, "amx_bf16": False}, True),  # AMD Zen 4 and later, Intel Cooper Lake
        ({"avx512_bf16": False, "amx_bf16": True}, True),  # AMX alone
        ({"avx512_bf16": True, "amx_bf16": True}, True),  # Intel Sapphire Rapids and later
        ({"avx512_bf16": False, "amx_bf16": False}, False),  # AVX2 or plain AVX-512: emulated
        ({}, False),
    ],
)
def test_the_detector_reads_avx512_bf16_or_amx_from_torchs_flags(flags, native):
    def cpuinfo_words():
        raise AssertionError("/proc/cpuinfo is read only where torch gives no flags")

    assert device_module.cpu_has_native_bfloat16(flags, cpuinfo_words) is native


@pytest.mark.parametrize(
    "words, native",
    [
        ({"fpu", "avx2", "avx512_bf16"}, True),
        ({"fpu", "avx2", "amx_bf16"}, True),
        ({"fpu", "avx2"}, False),
        (set(), False),  # no /proc/cpuinfo: emulated, the safe answer
    ],
)
def test_without_torchs_flags_the_detector_reads_proc_cpuinfo(words, native):
    assert device_module.cpu_has_native_bfloat16(None, lambda: words) is native


@pytest.mark.parametrize("kind, native, precision", [("native", True, "bfloat16"), ("emulated", False, "float32")])
def test_the_override_tells_the_detector_the_cpus_kind_and_auto_follows_it(monkeypatch, kind, native, precision):
    monkeypatch.setenv(device_module.BFLOAT16_OVERRIDE, kind)
    assert device_module.native_bfloat16("cpu") is native
    assert pick_precision("auto", "cpu", "float32") == precision
    assert device_module.native_bfloat16("meta") is False  # only the CPU's reading is overridden


def test_an_override_that_names_no_cpu_kind_is_refused(monkeypatch):
    monkeypatch.setenv(device_module.BFLOAT16_OVERRIDE, "yes")
    said = "MINIGPT_CPU_BFLOAT16 = 'yes' is not a CPU kind; set it to native or emulated"
    with pytest.raises(MinigptError, match=said):
        device_module.native_bfloat16("cpu")


def test_unset_the_detector_gives_the_flags_answer(monkeypatch):
    monkeypatch.delenv(device_module.BFLOAT16_OVERRIDE, raising=False)
    monkeypatch.setattr(device_module, "cpu_flags", lambda: {"avx512_bf16": False, "amx_bf16": True})
    assert device_module.native_bfloat16("cpu") is True
    monkeypatch.setattr(device_module, "cpu_flags", lambda: {"avx512_bf16": False, "amx_bf16": False})
    assert device_module.native_bfloat16("cpu") is False


def test_bfloat16_with_a_float64_model_is_refused():
    with pytest.raises(MinigptError, match='precision = "bfloat16" needs \\[model\\] dtype = "float32"'):
        pick_precision("bfloat16", "cpu", "float64")
