"""`minigpt sample` and minigpt.generate: the position table as a hard limit (refusal, sliding window,
--no-slide), the KV cache against full recompute, seeds, top-k / top-p on hand-made distributions,
streaming of split multi-byte characters, stop text, batches, JSON, and the CLI's refusals.

Run folders are built here from tiny seeded models (not by `minigpt train`), so every test is fast.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from conftest import CONTEXT, make_run, write_config
from typer.testing import CliRunner

from minigpt.api import load
from minigpt.cli import app
from minigpt.config import SampleConfig, load_config
from minigpt.errors import MinigptError
from minigpt.model.gpt import ContextTooLongError, MiniGPT
from minigpt.runs.reading import load_model
from minigpt.sampling.generate import CompletionText, choose, filter_logits, generate, next_token_distribution


@pytest.fixture(scope="module")
def char_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("char"))


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("byte"), kind="byte")


def cli(*args: str):
    return CliRunner().invoke(app, ["sample", *map(str, args)])


def ok(*args: str):
    result = cli(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def refused(*args: str) -> str:
    """The one stderr line of a refusal (exit 2, nothing on stdout, no traceback)."""
    result = cli(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert result.stdout == ""
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    return result.stderr.rstrip("\n")


def samples_json(*args: str) -> list[dict]:
    return [json.loads(line) for line in ok(*args, "--json").stdout.splitlines()]


def loaded(config: Path):
    cfg = load_config(config)
    return load_model(cfg)


@pytest.fixture
def forward_calls(monkeypatch) -> list[dict]:
    """Every call of MiniGPT.forward: batch, new positions, cached positions, and the ids."""
    calls = []
    real = MiniGPT.forward

    def spy(self, ids, targets=None, recorder=None, cache=None, last_only=False):
        calls.append(dict(batch=ids.shape[0], new=ids.shape[1], cached=cache.length if cache else 0, ids=ids.clone()))
        return real(self, ids, targets, recorder, cache, last_only)

    monkeypatch.setattr(MiniGPT, "forward", spy)
    return calls


def force_tokens(monkeypatch, script: list[int]) -> None:
    """Replace the model's forward by one whose next-token scores put the script's next id far on top."""
    step = {"n": 0}

    def forced(self, ids, targets=None, recorder=None, cache=None, last_only=False):
        logits = torch.zeros(ids.shape[0], ids.shape[1], self.vocab_size, dtype=torch.float32)
        logits[:, -1, script[step["n"]]] = 50.0
        step["n"] += 1
        return logits, None

    monkeypatch.setattr(MiniGPT, "forward", forced)


class Chunks(io.StringIO):
    """A stdout that remembers each write separately."""

    def __init__(self):
        super().__init__()
        self.chunks: list[str] = []

    def write(self, text: str) -> int:
        self.chunks.append(text)
        return super().write(text)


# ----------------------------------------------------------------------------------------------
# the position table is a hard limit


def test_prompt_longer_than_position_table_is_refused(char_run):
    message = refused("-c", char_run, "-p", "ROMEO: hello")  # 12 characters = 12 tokens
    assert message == (
        "minigpt: error: the prompt has 12 tokens but the position table has 8 rows "
        "([model] context = 8); the model has no row for position 8 and will not invent one, "
        "so use at most 8 tokens: shorten the prompt (e.g. keep its end; it is never cropped), "
        "or train a model with a larger [model] context"
    )
    # one token fewer than that would still be too long; exactly the table is accepted
    assert refused("-c", char_run, "-p", "ROMEO: he").startswith("minigpt: error: the prompt has 9 tokens ")
    assert samples_json("-c", char_run, "-p", "ROMEO: h", "-n", "2")[0]["prompt_ids"].__len__() == 8


def test_too_long_prompt_is_refused_by_generate_too_even_for_zero_new_tokens(char_run):
    model, tokenizer = loaded(char_run)
    with pytest.raises(ContextTooLongError, match=r"^the prompt has 9 tokens but the position table has 8 rows"):
        generate(model, tokenizer.encode("ROMEO: he"), SampleConfig(max_new_tokens=0))


@pytest.mark.parametrize("prompt", ["ROM", "ROMEO: h"])
def test_sliding_window_never_asks_the_model_for_more_than_context_positions(char_run, forward_calls, prompt):
    [sample] = samples_json("-c", char_run, "-p", prompt, "-n", "14")
    P = len(prompt)
    text = sample["prompt_ids"] + sample["token_ids"]
    assert sample["new_tokens"] == 14 and sample["stop_reason"] == "max_new_tokens"
    assert len(forward_calls) == 14  # one forward pass per new token
    assert max(c["new"] + c["cached"] for c in forward_calls) == CONTEXT
    # the KV cache while the window fills: the prompt once, then one token at a time ...
    filling = CONTEXT - P + 1
    assert [(c["new"], c["cached"]) for c in forward_calls[:filling]] == [(P, 0)] + [
        (1, cached) for cached in range(P, CONTEXT)
    ]
    # ... then, past the table, the last `context` tokens recomputed without a cache
    for c in forward_calls[filling:]:
        assert (c["new"], c["cached"]) == (CONTEXT, 0)
    for step, c in enumerate(forward_calls):
        length = P + step  # tokens in the text when this step's token was chosen
        assert c["ids"][0].tolist() == text[max(0, length - CONTEXT) : length][-c["new"] :]


def test_without_kv_cache_every_step_recomputes_at_most_context_positions(char_run, forward_calls):
    ok("-c", char_run, "-p", "ROM", "-n", "9", "--no-kv-cache", "--json")
    assert [(c["new"], c["cached"]) for c in forward_calls] == [
        (3, 0),
        (4, 0),
        (5, 0),
        (6, 0),
        (7, 0),
        (8, 0),
        (8, 0),
        (8, 0),
        (8, 0),
    ]


def test_no_slide_stops_when_the_text_fills_the_table(char_run, forward_calls):
    [sample] = samples_json("-c", char_run, "-p", "ROM", "-n", "20", "--no-slide")
    assert sample["stop_reason"] == "context_limit"
    assert sample["new_tokens"] == 5 == len(sample["token_ids"]) == len(sample["token_probs"])
    assert len(sample["prompt_ids"]) + sample["new_tokens"] == CONTEXT
    assert len(forward_calls) == 5
    # the same request with the sliding window goes on to the requested length
    [slid] = samples_json("-c", char_run, "-p", "ROM", "-n", "20")
    assert (slid["stop_reason"], slid["new_tokens"]) == ("max_new_tokens", 20)
    assert slid["token_ids"][:5] == sample["token_ids"]
    # a prompt that already fills the table gets nothing; text mode says why on stderr
    result = ok("-c", char_run, "-p", "ROMEO: h", "-n", "3", "--no-slide")
    assert result.stdout == "ROMEO: h\n"
    assert result.stderr.endswith(
        "stopped: context_limit (the text fills the 8-row position table; "
        "drop --no-slide to continue with a sliding window)\n"
    )


def test_config_can_turn_sliding_off_and_the_flag_turns_it_back_on(tmp_path):
    config = make_run(tmp_path, sample="slide = false\nmax_new_tokens = 12\n")
    assert samples_json("-c", config, "-p", "ROM")[0]["stop_reason"] == "context_limit"
    assert samples_json("-c", config, "-p", "ROM", "--slide")[0]["new_tokens"] == 12


# ----------------------------------------------------------------------------------------------
# KV cache against full recompute, and seeds


def test_kv_cache_and_full_recompute_give_the_same_tokens_and_logits(tmp_path, forward_calls):
    model, _ = loaded(make_run(tmp_path, n_layer=2, seed=2))  # a seed whose greedy text is not one token
    prompt = torch.tensor([[1, 2, 3], [7, 5, 0]])  # two different rows in one batch
    for greedy in (True, False):
        runs = {}
        for use_cache in (True, False):
            steps = list(
                generate(
                    model,
                    prompt,
                    SampleConfig(max_new_tokens=20, greedy=greedy, temperature=1.0),
                    use_cache=use_cache,
                    generator=torch.Generator().manual_seed(11),
                )
            )
            runs[use_cache] = (torch.stack([s.tokens for s in steps], 1), torch.stack([s.logits for s in steps], 1))
        (cached_tokens, cached_logits), (plain_tokens, plain_logits) = runs[True], runs[False]
        assert cached_tokens.shape == (2, 20)
        assert len(set(cached_tokens[0].tolist())) > 1  # a varied text, not one token repeated
        assert cached_tokens[0].tolist() != cached_tokens[1].tolist()  # rows are not mixed up
        assert torch.equal(cached_tokens, plain_tokens)
        assert (cached_logits - plain_logits).abs().max().item() <= 1e-5
    assert any(c["cached"] for c in forward_calls)  # the cache path really ran
    # through the CLI: the hidden --no-kv-cache flag gives the same greedy text
    config = tmp_path / "tiny.toml"
    with_cache = samples_json("-c", config, "-p", "JULIET", "-n", "15", "--greedy")[0]
    without = samples_json("-c", config, "-p", "JULIET", "-n", "15", "--greedy", "--no-kv-cache")[0]
    assert with_cache["token_ids"] == without["token_ids"]
    assert with_cache["token_probs"] == pytest.approx(without["token_probs"], abs=2e-6)


def without_timing(samples: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if k not in ("seconds", "tokens_per_second")} for s in samples]


def test_same_seed_gives_the_same_text_and_another_seed_another(char_run):
    args = ("-c", char_run, "-p", "JULIET:", "-n", "30", "--temperature", "1.0", "--num-samples", "2")
    torch.manual_seed(1)
    first = without_timing(samples_json(*args, "--seed", "7"))
    torch.manual_seed(2)  # the global RNG plays no part
    torch.rand(5)
    again = without_timing(samples_json(*args, "--seed", "7"))
    other = without_timing(samples_json(*args, "--seed", "8"))
    assert first == again
    assert first[0]["token_ids"] != other[0]["token_ids"]
    assert first[0]["token_ids"] != first[1]["token_ids"]  # the two samples of a batch differ
    assert ok(*args, "--seed", "7").stdout == ok(*args, "--seed", "7").stdout


# ----------------------------------------------------------------------------------------------
# temperature, top-k and top-p on a hand-made distribution

P = torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=torch.float64)  # deliberately not sorted


def dist(**kwargs) -> list[float]:
    return next_token_distribution(P.log(), **kwargs).tolist()


def test_plain_distribution_is_the_softmax_of_the_scores():
    assert dist() == pytest.approx([0.1, 0.4, 0.2, 0.3], abs=1e-12)


def test_temperature_sharpens_and_flattens():
    squared = (P**2 / (P**2).sum()).tolist()  # T = 0.5: p^2, renormalised
    rooted = (P.sqrt() / P.sqrt().sum()).tolist()  # T = 2: sqrt(p), renormalised
    assert dist(temperature=0.5) == pytest.approx(squared, abs=1e-12)
    assert dist(temperature=2.0) == pytest.approx(rooted, abs=1e-12)


@pytest.mark.parametrize(
    "top_k, expected",
    [
        (1, [0, 1, 0, 0]),
        (2, [0, 4 / 7, 0, 3 / 7]),
        (3, [0, 4 / 9, 2 / 9, 3 / 9]),
        (4, [0.1, 0.4, 0.2, 0.3]),
        (0, [0.1, 0.4, 0.2, 0.3]),  # off
        (99, [0.1, 0.4, 0.2, 0.3]),  # more than the vocabulary: all
    ],
)
def test_top_k_keeps_exactly_the_k_most_likely(top_k, expected):
    assert dist(top_k=top_k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "top_p, expected",
    [
        (0.3, [0, 1, 0, 0]),  # the most likely token alone already holds 0.4
        (0.39, [0, 1, 0, 0]),
        (0.65, [0, 4 / 7, 0, 3 / 7]),  # 0.4 < 0.65, 0.4 + 0.3 >= 0.65
        (0.75, [0, 4 / 9, 2 / 9, 3 / 9]),  # 0.7 < 0.75: the third token is needed
        (0.95, [0.1, 0.4, 0.2, 0.3]),
        (1.0, [0.1, 0.4, 0.2, 0.3]),  # off
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, expected):
    assert dist(top_p=top_p) == pytest.approx(expected, abs=1e-12)


def test_top_k_then_top_p_then_temperature_compose():
    # top-k 3 renormalises to 4/9, 3/9, 2/9; the nucleus of 0.5 then needs only 4/9 + 3/9
    assert dist(top_k=3, top_p=0.5) == pytest.approx([0, 4 / 7, 0, 3 / 7], abs=1e-12)
    # temperature first: T = 0.5 gives 1, 16, 4, 9 (/30); a nucleus of 0.6 keeps 16/30 + 9/30
    assert dist(temperature=0.5, top_p=0.6) == pytest.approx([0, 16 / 25, 0, 9 / 25], abs=1e-12)


def test_filters_work_row_by_row_and_keep_exactly_k_among_ties():
    logits = torch.stack([P.log(), P.flip(0).log(), torch.zeros(4, dtype=torch.float64)])
    filtered = filter_logits(logits, top_k=2)
    assert torch.isfinite(filtered).sum(dim=1).tolist() == [2, 2, 2]
    assert torch.isfinite(filtered[0]).tolist() == [False, True, False, True]
    assert torch.isfinite(filtered[1]).tolist() == [True, False, True, False]


def test_sampling_draws_only_kept_tokens_at_their_rates():
    probs = next_token_distribution(P.log(), top_k=2).expand(20000, 4)
    draws = choose(probs.log(), probs, greedy=False, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=4).tolist()
    assert counts[0] == counts[2] == 0
    assert counts[1] / 20000 == pytest.approx(4 / 7, abs=0.015)
    again = choose(probs.log(), probs, greedy=False, generator=torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)
    assert choose(P.log().unsqueeze(0), P.unsqueeze(0), greedy=True, generator=None).tolist() == [1]


def test_top_k_of_one_samples_the_greedy_text_with_probability_one(char_run):
    greedy = samples_json("-c", char_run, "-p", "ROM", "-n", "12", "--greedy")[0]
    top1 = samples_json("-c", char_run, "-p", "ROM", "-n", "12", "--top-k", "1", "--temperature", "1.5")[0]
    assert top1["token_ids"] == greedy["token_ids"]
    assert top1["token_probs"] == [1.0] * 12


# ----------------------------------------------------------------------------------------------
# streaming and stop text


def test_streaming_holds_back_split_multibyte_characters(byte_run, monkeypatch):
    completion = "é日x"
    script = list(completion.encode("utf-8"))  # c3 a9 | e6 97 a5 | 78: six byte tokens
    force_tokens(monkeypatch, script)
    run = load(config=byte_run, set=["sample.greedy=true", f"sample.max_new_tokens={len(script)}"])
    chunks = []
    [result] = run.samples("a", on_text=chunks.append)
    assert chunks == ["a", "é", "日", "x"]  # nothing handed out for a partial sequence
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert result.token_ids == script and result.completion == completion

    force_tokens(monkeypatch, script)
    result = ok("-c", byte_run, "-p", "a", "-n", str(len(script)), "--greedy")
    assert result.stdout == "a" + completion + "\n"


def test_json_of_a_byte_model_has_whole_characters(byte_run, monkeypatch):
    script = list("日本".encode())
    force_tokens(monkeypatch, script)
    [sample] = samples_json("-c", byte_run, "-p", "", "-n", "6", "--greedy")
    assert sample["prompt"] == "\n" and sample["prompt_ids"] == [10]  # the empty prompt is a newline
    assert sample["completion"] == "日本" and sample["token_ids"] == script


def test_stop_text_ends_the_sample_and_is_never_printed(char_run, monkeypatch):
    model, tokenizer = loaded(char_run)
    script = tokenizer.encode("hello world")
    force_tokens(monkeypatch, script)
    run = load(config=char_run, set={"sample.greedy": True, "sample.max_new_tokens": 11})
    chunks = []
    [result] = run.samples("a", on_text=chunks.append, stop="lo w")
    # "l" could start "lo w": it is held back until the next token decides
    assert chunks == ["a", "h", "e", "l"]
    assert result.completion == "hel" and result.stop_reason == "stop_text"
    assert result.token_ids == tokenizer.encode("hello w")  # generation ended with the stop text

    force_tokens(monkeypatch, script)
    [sample] = samples_json("-c", char_run, "-p", "a", "-n", "11", "--greedy", "--stop", "o w")
    assert (sample["completion"], sample["stop_reason"]) == ("hell", "stop_text")


def test_stop_text_is_taken_as_written_never_read_as_a_toml_value(char_run):
    for text in ("1", "true", "[1]"):  # as TOML: an integer, a boolean, an array; as text: none is in this vocabulary
        [sample] = samples_json("-c", char_run, "-p", "ROM", "-n", "3", "--stop", text)
        assert sample["stop_reason"] == "max_new_tokens" and sample["new_tokens"] == 3


def test_held_back_text_is_released_when_it_is_not_the_stop_text(char_run):
    _, tokenizer = loaded(char_run)
    text = CompletionText(tokenizer, stop="lo w")
    pieces = [text.push(i, 1.0) for i in tokenizer.encode("hello there")]
    assert pieces == ["h", "e", "", "l", "", "", "lo t", "h", "e", "r", "e"]
    assert text.finish() == "" and text.text == "hello there" and not text.stopped


def test_stop_text_in_one_sample_lets_the_others_go_on(char_run):
    args = ("-c", char_run, "-p", "ROM", "-n", "25", "--num-samples", "3", "--temperature", "1.0")
    free = samples_json(*args)
    stop = free[0]["completion"][3:5]  # text that sample 1 certainly produces
    assert any(stop not in sample["completion"] for sample in free)  # and some other sample does not
    stopped = samples_json(*args, "--stop", stop)
    first = free[0]["completion"]
    assert stopped[0]["completion"] == first[: first.index(stop)]
    assert stopped[0]["stop_reason"] == "stop_text"
    for before, after in zip(free, stopped):
        if stop not in before["completion"]:
            assert after == {**before, "seconds": after["seconds"], "tokens_per_second": after["tokens_per_second"]}


# ----------------------------------------------------------------------------------------------
# config and checkpoint


def test_checkpoint_whose_model_section_disagrees_with_the_config_is_refused(char_run):
    other = write_config(char_run.parent, "deeper.toml", n_layer=2)
    message = refused("-c", other, "-p", "ROM")
    assert message == (
        f"minigpt: error: checkpoint in {char_run.parent / 'run'} was trained with another "
        f"[model] section than {other} (n_layer: 2 != 1 (config != checkpoint)); use the config "
        f"it was trained with (it is saved as --config {char_run.parent / 'run' / 'config.toml'}), "
        f"or pass --run {char_run.parent / 'run'} alone, which reads it"
    )


def test_run_flag_overrides_the_run_folder_the_config_names(char_run, tmp_path):
    elsewhere = write_config(tmp_path, out="no-such-run")
    assert "no run folder at" in refused("-c", elsewhere, "-p", "ROM")
    [sample] = samples_json("-c", elsewhere, "--run", char_run.parent / "run", "-p", "ROM", "-n", "3")
    assert sample["new_tokens"] == 3


def test_sample_section_gives_defaults_and_flags_override_them(tmp_path):
    config = make_run(tmp_path, sample='prompt = "JULIET"\nmax_new_tokens = 4\nnum_samples = 2\nseed = 5\n')
    defaults = samples_json("-c", config)
    assert [(s["prompt"], s["new_tokens"]) for s in defaults] == [("JULIET", 4), ("JULIET", 4)]
    flags = samples_json("-c", config, "-p", "ROM", "-n", "2", "--num-samples", "1", "--seed", "5")
    assert [(s["prompt"], s["new_tokens"]) for s in flags] == [("ROM", 2)]


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--temperature", "0", ["temperature", "must be greater than 0"]),
        ("--top-p", "1.5", ["top_p", "must be at most 1.0"]),
        ("--top-k", "-1", ["top_k", "must be at least 0"]),
        ("--num-samples", "0", ["num_samples", "must be at least 1"]),
        ("-n", "-5", ["max_new_tokens", "must be at least 0"]),
    ],
)
def test_flag_values_are_validated_like_the_config(char_run, flag, value, words):
    message = refused("-c", char_run, "-p", "ROM", flag, value)
    assert message.startswith("minigpt: error: ")
    for word in words:
        assert word in message, message


# ----------------------------------------------------------------------------------------------
# prompts


def test_empty_prompt_starts_from_a_newline_and_help_says_so(char_run):
    _, tokenizer = loaded(char_run)
    for args in (("-p", ""), ()):
        [sample] = samples_json("-c", char_run, *args, "-n", "3")
        assert (sample["prompt"], sample["prompt_ids"]) == ("\n", tokenizer.encode("\n"))
    assert ok("-c", char_run, "-n", "3").stdout.startswith("\n")
    help_text = " ".join(CliRunner().invoke(app, ["sample", "--help"]).stdout.split())
    assert "An empty prompt starts from a newline" in help_text


def test_prompt_with_characters_the_char_tokenizer_never_saw_is_refused(char_run):
    message = refused("-c", char_run, "-p", "ROMzq")
    assert "2 character(s)" in message and "'q' 'z'" in message, message


def test_prompt_file_is_read_as_utf8(char_run, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("é日", encoding="utf-8")
    [sample] = samples_json("-c", char_run, "--prompt-file", path, "-n", "2")
    assert sample["prompt"] == "é日"


def test_prompt_file_refusals(char_run, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("ROM\xe9".encode("latin-1"))
    assert refused("-c", char_run, "--prompt-file", bad) == (
        f"minigpt: error: prompt file {bad} is not UTF-8: invalid byte 0xe9 at offset 3; convert it to UTF-8 "
        f"(e.g. iconv -t UTF-8)"
    )
    missing = tmp_path / "missing.txt"
    assert (
        refused("-c", char_run, "--prompt-file", missing)
        == f"minigpt: error: prompt file {missing} does not exist; pass an existing UTF-8 file"
    )
    assert (
        refused("-c", char_run, "--prompt-file", tmp_path)
        == f"minigpt: error: prompt file {tmp_path} is a directory; pass a UTF-8 text file"
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert (
        refused("-c", char_run, "--prompt-file", empty)
        == f"minigpt: error: prompt file {empty} is empty; pass a file with text in it"
    )
    assert (
        refused("-c", char_run, "-p", "ROM", "--prompt-file", bad)
        == "minigpt: error: --prompt and --prompt-file were both given; pass the prompt one way"
    )


# ----------------------------------------------------------------------------------------------
# batches and output


def test_num_samples_are_one_batch(char_run, forward_calls):
    samples = samples_json("-c", char_run, "-p", "ROM", "-n", "4", "--num-samples", "3")
    assert [s["sample"] for s in samples] == [1, 2, 3]
    assert [c["batch"] for c in forward_calls] == [3, 3, 3, 3]  # one forward per step for all three
    text = ok("-c", char_run, "-p", "ROM", "-n", "4", "--num-samples", "3").stdout
    lines = text.splitlines()
    assert lines[0] == "--- sample 1 ---" and text.count("--- sample ") == 3
    for i, sample in enumerate(samples, 1):
        assert f"--- sample {i} ---\nROM{sample['completion']}" in text


def test_json_reports_each_token_probability_and_speed(char_run):
    [sample] = samples_json("-c", char_run, "-p", "ROM", "-n", "10", "--temperature", "0.7")
    assert set(sample) == {
        "sample",
        "prompt",
        "completion",
        "prompt_ids",
        "token_ids",
        "token_probs",
        "stop_reason",
        "new_tokens",
        "seconds",
        "tokens_per_second",
        "trained_length",
        "longest_read",
        "past_trained_length",
    }
    # a learned table slides its window: never more than the trained length read at once
    assert sample["trained_length"] == CONTEXT and sample["past_trained_length"] is False
    assert sample["longest_read"] == min(3 + 10 - 1, CONTEXT)
    model, tokenizer = loaded(char_run)
    assert sample["completion"] == tokenizer.decode(sample["token_ids"])
    text = sample["prompt_ids"] + sample["token_ids"]
    with torch.no_grad():
        for step, (token, prob) in enumerate(zip(sample["token_ids"], sample["token_probs"])):
            length = 3 + step
            window = torch.tensor([text[max(0, length - CONTEXT) : length]])
            expected = torch.softmax(model(window)[0][0, -1] / 0.7, dim=-1)[token].item()
            assert prob == pytest.approx(expected, abs=2e-6)
    assert sample["tokens_per_second"] > 0
    assert sample["tokens_per_second"] == pytest.approx(10 / sample["seconds"], rel=0.01)


def test_text_mode_streams_prompt_and_completion_then_a_summary(char_run):
    [sample] = samples_json("-c", char_run, "-p", "ROM", "-n", "6", "--greedy")
    result = ok("-c", char_run, "-p", "ROM", "-n", "6", "--greedy")
    whole = "ROM" + sample["completion"]
    assert result.stdout == whole + ("" if whole.endswith("\n") else "\n")
    assert result.stderr.startswith("minigpt: 1 sample, 6 new tokens in ")
    assert result.stderr.endswith("; stopped: max_new_tokens\n")


def test_generate_refuses_ids_outside_the_vocabulary(char_run):
    model, _ = loaded(char_run)
    with pytest.raises(MinigptError, match=r"token id \d+ is not in the vocabulary"):
        generate(model, [0, model.vocab_size], SampleConfig(max_new_tokens=1))
