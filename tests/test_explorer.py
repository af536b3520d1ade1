"""minigpt/explorer.py, in-process: what `minigpt explore`'s page is answered. The distribution is
sampling's own `next_token_distribution` of the traced logits, bit for bit; the step is the token
`sample` appends; the attention matrices travel as the model's own bytes; the residual adds the
diagram draws are the model's adds; a padded vocabulary is never drawn; the attribution is Run.trace's
and the patching sweeps Run.patch's, their default tokens the two prompts' likeliest; refusals name
the request's fields, never a flag. The Host rules that keep other sites out (commands/explore.py)
are here too."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import train_tiny_run

import minigpt
from minigpt.commands.explore import Served
from minigpt.config import load_config
from minigpt.errors import MinigptError
from minigpt.explore.explorer import BARS, Explorer
from minigpt.inspection.comparison import row_norm
from minigpt.inspection.trace_text import render_text
from minigpt.model.gpt import MiniGPT
from minigpt.model.stages import RESIDUAL_ADDS
from minigpt.runs.checkpoints import model_payload
from minigpt.runs.folder import write_run_files
from minigpt.sampling.generate import next_token_distribution
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("explorer"), "--set", "model.n_layer=2")


@pytest.fixture(scope="module")
def explorer(run_dir):
    return Explorer(minigpt.load(run_dir))


def logits_at(run, prompt: str, position: int | None = None, **edits) -> torch.Tensor:
    trace = run.trace(prompt, position=position, compare=False, **edits)
    return trace.stage(None, "logits")


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.5},
        {"temperature": 1.7, "top_k": 5},
        {"temperature": 0.8, "top_p": 0.6},
        {"temperature": 1.0, "top_k": 3, "top_p": 0.5},
    ],
)
def test_the_bars_are_samples_own_distribution_of_the_traced_logits(explorer, settings):
    run = explorer.run
    answer = explorer.next_tokens({"prompt": "ROMEO:", "position": 4, **settings})
    logits = logits_at(run, "ROMEO:", position=4)
    expected = next_token_distribution(
        logits, settings["temperature"], settings.get("top_k", 0), settings.get("top_p", 1.0)
    )
    plain = next_token_distribution(logits)
    order = torch.sort(logits, descending=True, stable=True).indices[:BARS].tolist()
    assert [c["id"] for c in answer["candidates"]] == order
    assert [c["probability"] for c in answer["candidates"]] == [float(expected[i]) for i in order]
    assert [c["unfiltered"] for c in answer["candidates"]] == [float(plain[i]) for i in order]
    assert answer["kept"] == int((expected > 0).sum()) and answer["of"] == run.tokenizer.vocab_size
    if "top_k" in settings:
        assert answer["kept"] <= settings["top_k"]
    assert "before" not in answer  # no intervention: one distribution


def test_with_an_intervention_the_bars_show_both_passes(explorer):
    run = explorer.run
    request = {"prompt": "ROMEO", "scale": ["0.attention=0"], "temperature": 0.7}
    answer = explorer.next_tokens(request)
    after = next_token_distribution(logits_at(run, "ROMEO", scale={"0.attention": 0}), 0.7)
    before = next_token_distribution(logits_at(run, "ROMEO"), 0.7)
    assert [c["probability"] for c in answer["candidates"]] == [float(after[c["id"]]) for c in answer["candidates"]]
    assert [c["probability"] for c in answer["before"]["candidates"]] == [
        float(before[c["id"]]) for c in answer["before"]["candidates"]
    ]


def test_a_slider_move_reuses_the_traced_logits_instead_of_tracing_again(explorer, monkeypatch):
    explorer.trace({"prompt": "ROMEO", "position": 2})
    calls = []
    monkeypatch.setattr(explorer.run, "trace", lambda *a, **k: calls.append(k))
    for t in (0.3, 0.9, 1.5):
        explorer.next_tokens({"prompt": "ROMEO", "position": 2, "temperature": t})
    assert calls == []


@pytest.mark.parametrize("settings", [{"greedy": True}, {"seed": 7}, {"seed": 8, "temperature": 1.3, "top_k": 4}])
def test_a_step_appends_the_token_sample_appends(explorer, settings):
    run = explorer.run
    answer = explorer.step({"prompt": "ROMEO", **settings})
    sampled = run.samples("ROMEO", max_new_tokens=1, **settings)[0]
    ids = run.tokenizer.encode("ROMEO")
    assert answer["ids"] == [*ids, sampled.token_ids[0]] and answer["id"] == sampled.token_ids[0]
    assert answer["probability"] == sampled.token_probs[0]
    assert answer["text"] == sampled.text
    # The same tokens as ids: the same step.
    assert explorer.step({"ids": ids, **settings})["id"] == answer["id"]


def test_the_views_carry_every_attention_weight_exactly_and_every_rows_norm(explorer):
    run = explorer.run
    answer = explorer.trace({"prompt": "ROMEO: I", "position": 5, "views": True, "ablate_head": ["1.0"]})
    trace = run.trace("ROMEO: I", position=5, ablate_head=["1.0"])
    for b, packed in enumerate(answer["views"]["attention"]):
        weights = np.frombuffer(base64.b64decode(packed["data"]), dtype="<f4").reshape(packed["shape"])
        assert packed["dtype"] == "float32"
        assert torch.equal(torch.from_numpy(weights.copy()), trace.after.whole(b, "attention_weights"))
        # the traced row is `trace --json`'s attention_weights, exactly
        assert weights[:, 5, :6].tolist() == answer["after"]["blocks"][b]["attention_weights"]
    norms = answer["views"]["norms"]
    assert set(norms) == {"before", "after"}
    for name, tr in (("before", trace.before), ("after", trace.after)):
        for b, block in enumerate(tr.blocks):
            assert norms[name]["blocks"][b] == {
                "input": row_norm(block.input.row),
                **{stage: row_norm(row) for stage, row in block.stages.items()},
            }
        assert norms[name]["final_norm"] == row_norm(tr.final_norm.row)
    for b, block in enumerate(answer["stages"]):  # --compare's own norms agree
        assert {k: c["norm_after"] for k, c in block.items()} == norms["after"]["blocks"][b]
    plain = {k: v for k, v in answer.items() if k != "views"}
    assert plain == trace.as_dict()  # beside the views, the trace is what trace --json prints


@pytest.mark.parametrize("prompt", ["ROMEO?", "ROMEO:"])
def test_the_page_names_the_traced_token_quoted_with_its_id_as_trace_does(explorer, prompt):
    """A title "output at position 23 (token ?)" read as an unknown token where the token was "?":
    the page's titles take the traced token as the trace command's header writes it."""
    answer = explorer.trace({"prompt": prompt, "views": True})
    p, token = answer["position"], answer["tokens"][answer["position"]]
    assert token == prompt[-1]
    label = answer["views"]["traced_token"]
    assert label == f"token {token!r}, id {answer['ids'][p]}"  # e.g. token '?', id 12
    header = render_text(explorer.run.trace(prompt)).splitlines()[0]
    assert f"({label})" in header  # trace of position 5 (token '?', id N) in a prompt of 6 token(s)


def test_float64_runs_send_float64_weights(tmp_path):
    explorer = Explorer(minigpt.load(Path(__file__).resolve().parents[1] / "data" / "lesson09"))
    packed = explorer.trace({"ids": [0, 1, 2], "views": True})["views"]["attention"][0]
    weights = np.frombuffer(base64.b64decode(packed["data"]), dtype="<f8").reshape(packed["shape"])
    assert (
        packed["dtype"] == "float64"
        and weights[:, 2, :3].tolist() == explorer.trace({"ids": [0, 1, 2]})["blocks"][0]["attention_weights"]
    )


@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_residual_adds_the_diagram_draws_are_the_models_adds(position):
    """Each add named in RESIDUAL_ADDS is its source plus the stage computed just before it, at
    every position, exactly (the page draws its skip connection from that source)."""
    cfg = load_config(
        None,
        [
            f'model.norm_position="{position}"',
            "model.n_layer=2",
            "model.n_embd=16",
            "model.n_head=2",
            "model.ffn_hidden=32",
            "model.context=8",
        ],
    )
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, vocab_size=10).eval()
    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcdefghij"))
    from minigpt.inspection.trace import trace_position

    trace = trace_position(model, tokenizer, [1, 2, 3, 4])
    for b, block in enumerate(trace.blocks):
        order = ["input", *block.stages]
        for add, source in RESIDUAL_ADDS[position].items():
            update = order[order.index(add) - 1]

            def whole(name, b=b):
                if name == "input":
                    return trace.whole(None, "input") if b == 0 else trace.whole(b - 1, "output")
                return trace.whole(b, name)

            assert order.index(source) < order.index(update) < order.index(add)
            assert torch.equal(whole(add), whole(source) + whole(update)), (b, add)


@pytest.fixture
def padded_run(tmp_path, tiny_config):
    """A char run whose model has 8 rows past its tokenizer's ids, rows made to win every draw."""
    text = (tmp_path / "tiny.txt").read_text(encoding="utf-8")
    tokenizer = TextTokenizer(train_tokenizer("char", 0, text))
    cfg = load_config(tiny_config)
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, vocab_size=tokenizer.vocab_size + 8).eval()
    with torch.no_grad():
        model.final_norm.weight.fill_(0.01)  # the final norm's output is nearly its bias, all tens,
        model.final_norm.bias.fill_(10.0)
        model.head.weight[tokenizer.vocab_size :] = 1.0  # which the padded rows read as logits of ~160
    (tmp_path / "padded").mkdir()
    write_run_files(tmp_path / "padded", cfg, tokenizer, model_payload(cfg, model, tokenizer.vocab_size))
    return tmp_path / "padded"


def test_a_padded_vocabulary_is_never_drawn_nor_barred(padded_run):
    explorer = Explorer(minigpt.load(padded_run))
    writable = explorer.run.tokenizer.vocab_size
    plain = explorer.trace({"prompt": "ROMEO"})
    assert plain["next_tokens"][0]["id"] >= writable  # the trace ranks every row, padding included
    answer = explorer.next_tokens({"prompt": "ROMEO", "temperature": 1.0})
    assert all(c["id"] < writable for c in answer["candidates"]) and answer["of"] == writable
    assert explorer.model_info()["writable"] == writable
    for seed in range(5):
        assert explorer.step({"prompt": "ROMEO", "seed": seed})["id"] < writable
    assert explorer.step({"prompt": "ROMEO", "greedy": True})["id"] < writable


@pytest.mark.parametrize(
    "call, body, message",
    [
        ("next_tokens", {"prompt": "RO", "temperature": 0}, "temperature 0: [sample] temperature = 0 must be greater"),
        ("next_tokens", {"prompt": "RO", "top_p": 1.5}, "top_p 1.5"),
        ("next_tokens", {"prompt": "RO", "top_k": -1}, "top_k -1"),
        ("step", {"prompt": "RO", "seed": "x"}, "seed x"),
        ("step", {"ids": "0,1,2,3,4,5,6,7"}, "fills the position table (8 rows)"),
        ("step", {"prompt": "RO", "ids": "1"}, "exactly one of prompt TEXT or ids"),
        ("step", {"ids": []}, "ids is empty"),
        ("trace", {"prompt": "RO", "views": "yes"}, "views 'yes' must be true or false"),
        ("trace", {"ids": [1, "2"]}, "ids [1, '2'] must be a list of integers"),
        ("trace", {"prompt": 3}, "prompt 3 must be a string"),
        ("trace", {"prompt": "RO", "position": True}, "position True is not an integer"),
        ("trace", {"prompt": "RO", "at_position": 1}, "at_position 1 must be true or false"),
        ("trace", {"prompt": "RO", "set_input": [1, 2]}, "set_input [1, 2] must be a string"),
        ("trace", ["a list"], "must be a JSON object"),
        ("step", "text", "must be a JSON object"),
        ("trace", {"prompt": "RO", "attribute": 1.5}, 'attribute 1.5 must be a token\'s text, "#ID" or an integer id'),
        ("trace", {"prompt": "RO", "attribute": True}, "attribute True must be a token's text"),
        ("trace", {"prompt": "RO", "versus": "O"}, "versus is the token an attribution compares with; give attribute"),
        ("trace", {"prompt": "RO", "attribute": "RO"}, "attribute 'RO' encodes to 2 tokens"),
        ("trace", {"prompt": "RO", "attribute": "#9999"}, "attribute '#9999': this model has"),
        ("trace", {"prompt": "RO", "attribute": "O", "versus": "#x"}, "versus '#x': 'x' is not a token id"),
        ("trace", {"prompt": "RO", "attribute": "O", "versus": "O"}, "attribute and versus are the same token"),
        ("trace", {"prompt": "RO", "attribute": "O", "replace_residual": ["0"]}, "attribution with replace_residual"),
        ("next_tokens", {"prompt": "RO", "attribute": ["O"]}, "attribute ['O'] must be a token's text"),
        ("trace", {"prompt": "RO", "patch": "0.ffn"}, 'patch \'0.ffn\' must be an object {"clean", "block"'),
        ("trace", {"prompt": "RO", "patch": {"clean": "R", "block": 0, "stage": "ffn"}}, "clean prompt has 1 tokens"),
        ("trace", {"prompt": "RO", "patch": {"clean": "RA", "block": 0, "stage": "x"}}, "the patch's stage 'x'"),
        ("trace", {"prompt": "RO", "patch": {"clean": "RA", "block": 2, "stage": "ffn"}}, "the patch's block 2"),
        ("trace", {"prompt": "RO", "patch": {"clean": "RA", "block": 0, "stage": "heads"}}, "give the patch's head"),
        ("trace", {"prompt": "RO", "patch": {"clean": "R€", "block": 0, "stage": "ffn"}}, "patch's clean prompt: text"),
        (
            "trace",
            {"prompt": "RO", "attribute": "O", "patch": {"clean": "RA", "block": 1, "stage": "output", "position": 1}},
            "attribution at a position where a patch puts back the clean prompt's output",
        ),
        ("patch", "text", "must be a JSON object"),
        ("patch", {"clean": 3, "corrupt": "RA"}, "clean 3 must be a string or a list of integers"),
        ("patch", {"clean": "RO", "corrupt": [0, "1"]}, "corrupt [0, '1'] must be a string or a list of integers"),
        (
            "patch",
            {"corrupt": "RA"},
            "patching needs clean TEXT, corrupt TEXT, answer TOKEN and versus TOKEN; clean is",
        ),
        ("patch", {"clean": "RO", "corrupt": ""}, "corrupt is missing"),
        ("patch", {"clean": "RO", "corrupt": "ROM"}, "the clean prompt has 2 tokens and the corrupt one 3"),
        ("patch", {"clean": "RO", "corrupt": "RA", "by": "block"}, "by 'block': patch by one of: stage, head"),
        ("patch", {"clean": "RO", "corrupt": "RA", "by": 1}, 'by 1 must be "stage" or "head"'),
        ("patch", {"clean": "R€", "corrupt": "RA"}, "clean: text has 1 character(s) the char tokenizer never saw"),
        ("patch", {"clean": "RO", "corrupt": "R€"}, "corrupt: text has 1 character(s) the char tokenizer never saw"),
        ("patch", {"clean": "RO", "corrupt": "RA", "answer": 2.5}, "answer 2.5 must be a token's text"),
        ("patch", {"clean": "RO", "corrupt": "RA", "answer": "#x"}, "answer '#x': 'x' is not a token id"),
        (
            "patch",
            {"clean": "RO", "corrupt": "RA", "answer": "O", "versus": "O"},
            "answer and versus are the same token",
        ),
        ("patch", {"clean": "RO", "corrupt": "RO"}, "end in the same logit difference"),
    ],
)
def test_refusals_name_the_requests_fields_never_a_flag(explorer, call, body, message):
    with pytest.raises(MinigptError) as caught:
        getattr(explorer, call)(body)
    assert message in str(caught.value) and "--" not in str(caught.value)


def test_the_attribution_is_run_traces_own(explorer):
    run = explorer.run
    answer = explorer.trace({"prompt": "ROMEO", "position": 3, "attribute": "#36", "versus": " ", "views": True})
    expected = run.trace("ROMEO", position=3, attribute="#36", versus=" ").as_dict()
    assert {k: v for k, v in answer.items() if k != "views"} == expected
    assert [p["name"] for p in answer["attribution"]["parts"]][:3] == ["token", "position", "0.attention.head0"]
    # with an intervention, both passes split: the before pass is the plain one's
    answer = explorer.trace({"prompt": "ROMEO", "attribute": 36, "ablate_head": ["1.0"], "at_position": True})
    expected = run.trace("ROMEO", attribute=36, ablate_head=["1.0"], at_position=True).as_dict()
    assert (
        answer == expected
        and answer["before"]["attribution"] == run.trace("ROMEO", attribute=36).as_dict()["attribution"]
    )
    assert answer["after"]["attribution"]["parts"][6] == {"name": "1.attention.head0", "value": 0.0}
    # the bars that follow read the same logits, attribution or not
    assert explorer.next_tokens({"prompt": "ROMEO", "attribute": "#36"}) == explorer.next_tokens({"prompt": "ROMEO"})


def test_a_patched_trace_is_run_traces_own(explorer):
    run = explorer.run
    where = {"clean": "the cat", "block": 1, "stage": "ffn", "position": 5, "head": None}
    answer = explorer.trace({"prompt": "the dog", "position": 5, "patch": where, "attribute": 36, "views": True})
    expected = run.trace("the dog", position=5, patch=where, attribute=36)
    assert {k: v for k, v in answer.items() if k != "views"} == expected.as_dict()
    assert answer["interventions"] == ["patch 1.ffn@5 from clean"]
    assert answer["after"]["blocks"][1]["stages"]["ffn"] == run.trace("the cat", position=5).blocks[1].stages["ffn"]
    assert answer["before"] == run.trace("the dog", position=5, attribute=36).as_dict()
    assert answer["views"]["norms"]["after"]["final_norm"] == row_norm(expected.after.final_norm.row)
    # the bars that follow read the patched logits, before and after
    bars = explorer.next_tokens({"prompt": "the dog", "position": 5, "patch": where})
    assert bars == explorer.next_tokens({"prompt": "the dog", "position": 5, "patch": where, "attribute": 36})
    assert bars["candidates"][0]["logit"] == max(expected.after.stage(None, "logits").tolist())


def likeliest(run, prompt: str) -> list[int]:
    """The prompt's next-token ids by logit (ties: lower id first), over the ids the tokenizer writes."""
    logits = run.trace(prompt).stage(None, "logits")[: run.tokenizer.vocab_size]
    return torch.sort(logits, descending=True, stable=True).indices.tolist()


@pytest.mark.parametrize("by", ["stage", "head"])
def test_patching_is_run_patchs_own(explorer, by):
    run = explorer.run
    answer = explorer.patch({"clean": "the cat", "corrupt": "the dog", "answer": "e", "versus": "#1", "by": by})
    assert {k: v for k, v in answer.items() if k != "spelled"} == run.patch(
        "the cat", "the dog", "e", "#1", by=by
    ).as_dict()
    assert answer["spelled"] == {"answer": "e", "versus": "#1"}  # a space shows as its id in a box
    ids = run.tokenizer.encode("the dog")
    as_ids = explorer.patch(
        {"clean": run.tokenizer.encode("the cat"), "corrupt": ids, "answer": 36, "versus": 1, "by": by}
    )
    assert as_ids["effects"] == answer["effects"] and as_ids["corrupt"]["text"] is None


@pytest.mark.parametrize("clean, corrupt", [("RO", "RA"), ("the cat", "the dog")])
def test_patching_defaults_to_each_prompts_likeliest_next_token(explorer, clean, corrupt):
    """The answer is the clean prompt's likeliest next token, versus the corrupt one's likeliest
    other than the answer (the second pair shares its likeliest: versus is the runner-up)."""
    run = explorer.run
    answer_id = likeliest(run, clean)[0]
    versus_id = next(i for i in likeliest(run, corrupt) if i != answer_id)
    answer = explorer.patch({"clean": clean, "corrupt": corrupt})
    assert (answer["answer_id"], answer["versus_id"]) == (answer_id, versus_id)
    assert {k: v for k, v in answer.items() if k != "spelled"} == run.patch(
        clean, corrupt, answer_id, versus_id
    ).as_dict()
    given = explorer.patch({"clean": clean, "corrupt": corrupt, "answer": "#1" if answer_id != 1 else "#2"})
    assert given["versus_id"] == next(i for i in likeliest(run, corrupt) if i != given["answer_id"])


@pytest.fixture
def post_norm_run(tmp_path, tiny_config):
    text = (tmp_path / "tiny.txt").read_text(encoding="utf-8")
    tokenizer = TextTokenizer(train_tokenizer("char", 0, text))
    cfg = load_config(tiny_config, ['model.norm_position="post"'])
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, vocab_size=tokenizer.vocab_size).eval()
    (tmp_path / "post").mkdir()
    write_run_files(tmp_path / "post", cfg, tokenizer, model_payload(cfg, model, tokenizer.vocab_size))
    return tmp_path / "post"


def test_the_page_is_told_why_a_model_has_no_attribution(explorer, post_norm_run):
    refusals = explorer.model_info()["attribution"]
    assert refusals["refused"] is None and "attribution with replace_residual" in refusals["refused_replacing"]
    # where a patch puts back a residual-stream row or the attention update, the sum is broken there
    patching = refusals["refused_patching"]
    assert [stage for stage, why in patching.items() if why] == ["input", "attention", "residual1", "output"]
    assert patching["ffn"] is None and patching["heads"] is None
    where = {"clean": "RA", "block": 0, "stage": "attention", "position": None}
    with pytest.raises(MinigptError) as caught:
        explorer.trace({"prompt": "RO", "attribute": "O", "patch": where})
    assert str(caught.value) == patching["attention"]
    post = Explorer(minigpt.load(post_norm_run))
    refused = post.model_info()["attribution"]["refused"]
    assert "this model is post-norm" in refused and "--" not in refused
    for call, body in (("trace", {"prompt": "RO", "attribute": "O"}), ("patch", {"clean": "RO", "corrupt": "RA"})):
        with pytest.raises(MinigptError) as caught:
            getattr(post, call)(body)
        assert str(caught.value) == refused


def test_the_page_starts_where_sample_starts(explorer):
    info = explorer.model_info()
    s = explorer.run.cfg.sample
    assert info["sample"] == dataclasses.asdict(s)  # the controls' temperature, top_k, top_p, greedy, seed among them
    assert info["residual_adds"] == RESIDUAL_ADDS["pre"] and info["n_layer"] == 2
    assert info["scalable"] == ["attention", "ffn"]
    json.dumps(info)  # all of it JSON


# ---------------------------------------------------------------- which Host and Origin are this server


@pytest.mark.parametrize(
    "bound, header, answered",
    [
        ("127.0.0.1", "127.0.0.1:8017", True),
        ("127.0.0.1", "localhost:8017", True),
        ("127.0.0.1", "LOCALHOST:8017", True),
        ("127.0.0.1", "[::1]:8017", True),
        ("127.0.0.1", "127.0.0.1:8018", False),  # another port: another server
        ("127.0.0.1", "127.0.0.1", False),  # no port: port 80
        ("127.0.0.1", "evil.example:8017", False),  # DNS rebinding: a name that resolved to us
        ("127.0.0.1", "localhost.evil.example:8017", False),
        ("127.0.0.1", "", False),
        ("127.0.0.1", None, False),
        ("localhost", "127.0.0.1:8017", True),
        ("::1", "[::1]:8017", True),
        ("0.0.0.0", "192.168.1.20:8017", True),  # every address: any IP literal, never a name
        ("0.0.0.0", "[fe80::1]:8017", True),
        ("0.0.0.0", "localhost:8017", True),
        ("0.0.0.0", "evil.example:8017", False),
        ("myhost.lan", "myhost.lan:8017", True),
        ("myhost.lan", "127.0.0.1:8017", False),
        ("192.168.1.20", "192.168.1.20:8017", True),
        ("192.168.1.20", "192.168.1.21:8017", False),
    ],
)
def test_the_server_answers_only_to_its_own_address(bound, header, answered):
    assert Served(bound, 8017).names(header) is answered


@pytest.mark.parametrize(
    "origin, answered",
    [
        ("http://127.0.0.1:8017", True),
        ("http://localhost:8017", True),
        ("https://127.0.0.1:8017", False),
        ("http://127.0.0.1:9999", False),
        ("http://evil.example", False),
        ("http://evil.example:8017", False),
        ("null", False),  # a sandboxed frame or a file:// page
    ],
)
def test_a_post_is_answered_only_from_the_servers_own_page(origin, answered):
    assert Served("127.0.0.1", 8017).origin(origin) is answered
