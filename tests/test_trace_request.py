"""One request type behind `Run.trace` and `minigpt trace`: the command's flags and the API's
keywords name the same fields, and the same question gives the same answer whichever way it is
asked (the chapter 17 run, shipped in data/chapter17)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

import minigpt
from minigpt.api import MinigptError, TraceRequest
from minigpt.cli import app
from minigpt.commands.options_inspect import TraceOptions

CHAPTER_RUN = Path(__file__).resolve().parents[1] / "data" / "chapter17"
runner = CliRunner()


def test_every_field_of_the_request_is_a_flag_of_the_trace_command():
    # `patch` is the one field without a flag of its own: the patch command and the explore page ask it
    flags = {f.name for f in fields(TraceOptions)}
    assert set(TraceRequest.fields()) - {"patch"} <= flags
    # and the command's own (how to print, which run) are not the request's
    assert {"digits", "as_json", "png", "run", "feed"} <= flags - set(TraceRequest.fields())


def test_options_left_out_make_the_default_request():
    # but one: the command shows the modified pass alone unless --compare is given, where the API
    # compares whenever there is an intervention (compare=None)
    assert TraceRequest.from_options(TraceOptions()) == TraceRequest(compare=False)


@pytest.mark.parametrize(
    "flags, keywords",
    [
        (["--ids", "0,1,2", "--position", "1"], {"ids": "0,1,2", "position": 1}),
        (
            ["-p", "abc", "--scale", "0.ffn=0.5", "--attribute", "b", "--versus", "c", "--grad", "--target", "a"],
            {
                "prompt": "abc",
                "scale": ["0.ffn=0.5"],
                "compare": False,
                "attribute": "b",
                "versus": "c",
                "grad": True,
                "target": "a",
            },
        ),
        (
            ["-p", "abc", "--set-row", "token_table.a=2,1", "--all-positions"],
            {"prompt": "abc", "set_row": {"token_table.a": [2, 1]}, "all_positions": True},
        ),
        (["-p", "abc", "--scale", "0.attention=0", "--compare"], {"prompt": "abc", "scale": {"0.attention": 0}}),
        (
            ["-p", "abc", "--compare-ids", "2,1,0", "--ablate-head", "0.1"],
            {"prompt": "abc", "compare_ids": [2, 1, 0], "ablate_head": ["0.1"]},
        ),
    ],
)
def test_the_command_and_the_api_answer_one_request_alike(flags, keywords):
    result = runner.invoke(app, ["trace", "--run", str(CHAPTER_RUN), "--json", *flags])
    assert result.exit_code == 0, result.output
    run = minigpt.load(CHAPTER_RUN)
    by_keywords = run.trace(**keywords)
    by_request = run.trace(TraceRequest(**keywords))
    assert json.loads(result.stdout) == json.loads(by_keywords.to_json()) == json.loads(by_request.to_json())


def test_an_unknown_keyword_is_refused_naming_the_fields():
    run = minigpt.load(CHAPTER_RUN)
    with pytest.raises(MinigptError, match=r"trace takes no posiiton; it takes: prompt, ids, position"):
        run.trace("abc", posiiton=1)
    with pytest.raises(MinigptError, match="not both"):
        run.trace(TraceRequest(prompt="abc"), grad=True)


def test_a_request_refuses_fields_that_do_not_go_together_before_any_pass():
    with pytest.raises(MinigptError, match="needs at least one intervention"):
        TraceRequest(compare=True).check([])
    with pytest.raises(MinigptError, match="give .*grad.* too"):
        TraceRequest(target="a").check([])
    with pytest.raises(MinigptError, match="every position of one pass"):
        TraceRequest(all_positions=True, compare_ids="0,1").check([])
