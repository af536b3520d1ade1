"""PyTorch's own hooks fire on the model a user loads: a forward hook and a forward pre-hook on every
submodule fire once per call, in a plain forward pass, in `trace`, in sampling (past the position
table too, where sampling otherwise runs a folded copy), in `eval` and in training."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import CONTEXT, CORPUS, make_run

import minigpt
from minigpt.model.hooks import hooked


@pytest.fixture
def run(tmp_path):
    return minigpt.load(config=make_run(tmp_path / "seeded", n_layer=2))


def listen(model: torch.nn.Module) -> tuple[Counter, Counter, list]:
    """A forward hook and a forward pre-hook on the model and on every submodule, counting calls."""
    before, after, handles = Counter(), Counter(), []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda m, args, name=name: before.update([name])))
        handles.append(module.register_forward_hook(lambda m, args, out, name=name: after.update([name])))
    return before, after, handles


PER_BLOCK = ("norm1", "attention", "attention.qkv", "attention.out", "norm2", "ffn", "ffn.W1", "ffn.W2")


def fired_everywhere(model: torch.nn.Module, before: Counter, after: Counter, passes: int, extra=()) -> None:
    """Every module's hooks fired, and as often as the passes (calls of the model) made, plus one
    for each module named in `extra` (called once more outside the pass). A ModuleList holds the
    blocks but is never called: it has no forward."""
    names = [name for name, m in model.named_modules() if not isinstance(m, torch.nn.ModuleList)]
    blocks = [f"blocks.{i}.{part}" for i in range(len(model.blocks)) for part in PER_BLOCK]
    assert {"", "token_table", "position_table", "final_norm", "head", *blocks} <= set(names)
    assert before == after
    assert set(after) == set(names), set(names) ^ set(after)
    assert after[""] == passes  # the model itself, once per forward pass
    expected = {name: passes + (name in extra) for name in names}
    assert dict(after) == expected, {n: (c, expected[n]) for n, c in after.items() if c != expected[n]}


def test_every_submodule_fires_its_hooks_once_in_a_forward_pass(run):
    before, after, _ = listen(run.model)
    with torch.no_grad():
        run.model(torch.tensor([run.tokenizer.encode("ROMEO")]))
    fired_everywhere(run.model, before, after, passes=1)


def test_every_submodule_fires_its_hooks_in_a_trace(run):
    before, after, _ = listen(run.model)
    trace = run.trace("ROMEO:")
    # the logit lens reads every block's output through the model's own final_norm and head: one call more
    fired_everywhere(run.model, before, after, passes=1, extra=("final_norm", "head"))
    assert len(trace.blocks) == 2


def test_a_hook_sees_what_the_trace_records(run):
    seen = {}
    run.model.blocks[1].norm2.register_forward_hook(lambda m, args, out: seen.update(norm2=out.detach()))
    trace = run.trace("ROMEO:")
    assert torch.equal(seen["norm2"][0, trace.position], trace.stage(1, "norm2"))


@pytest.mark.parametrize("new_tokens", [3, 3 * CONTEXT])  # inside the table, and well past it
def test_every_submodule_fires_its_hooks_once_per_token_in_sampling(run, new_tokens):
    before, after, _ = listen(run.model)
    run.sample("RO", max_new_tokens=new_tokens, seed=1)
    fired_everywhere(run.model, before, after, passes=new_tokens)  # one pass per new token


def test_sampling_with_hooks_continues_as_sampling_without_them(run):
    plain = run.samples("RO", max_new_tokens=3 * CONTEXT, seed=2, greedy=True)[0].token_ids
    _, _, handles = listen(run.model)
    hooked_ids = run.samples("RO", max_new_tokens=3 * CONTEXT, seed=2, greedy=True)[0].token_ids
    for handle in handles:
        handle.remove()
    assert hooked_ids == plain  # greedy: the folded copy and the model pick the same tokens here


def test_every_submodule_fires_its_hooks_in_eval(run, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(CORPUS * 3, encoding="utf-8")
    before, after, _ = listen(run.model)
    scores = run.eval(text)
    assert after[""] >= 1 and scores.tokens > CONTEXT  # every window of the text, batched
    fired_everywhere(run.model, before, after, passes=after[""])


def test_every_submodule_fires_its_hooks_in_training(tiny_config, tmp_path):
    counts = {}

    def on_start(session):
        counts["before"], counts["after"], _ = listen(session.model)
        counts["model"] = session.model

    minigpt.train(out=tmp_path / "run", steps=3, config=tiny_config, progress=False, on_start=on_start)
    fired_everywhere(counts["model"], counts["before"], counts["after"], passes=counts["after"][""])
    assert counts["after"][""] >= 3  # a pass a step, and the evaluations'


def test_hooked_sees_a_hook_on_any_submodule_and_on_every_module():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    assert not hooked(model)
    for register in (
        lambda: model[1][0].register_forward_hook(lambda *a: None),
        lambda: model[0].register_forward_pre_hook(lambda *a: None),
        lambda: torch.nn.modules.module.register_module_forward_hook(lambda *a: None),
        lambda: torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: None),
    ):
        handle = register()
        assert hooked(model)
        handle.remove()
        assert not hooked(model)
