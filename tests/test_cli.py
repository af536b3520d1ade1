"""The command line: a mistake ends like every other user error (one line on stderr, exit status 2);
a flag that sets a config key is built from that key's field in config.py; what typer keeps private
is reached from one module only."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "args, expected",
    [
        (["train", "--steps", "abc"], "minigpt: error: Invalid value for '--steps': "),
        (["train", "--bogus"], "minigpt: error: No such option: --bogus"),
        (["trace", "-p", "x", "--position", "abc"], "minigpt: error: Invalid value for '--position': "),
        (["nosuch"], "minigpt: error: No such command 'nosuch'; see '"),
    ],
)
def test_a_command_line_mistake_is_one_line_and_exit_2(minigpt_process, args, expected):
    result = minigpt_process(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(expected)
    assert "Traceback" not in result.stderr


def test_no_arguments_shows_the_help_and_succeeds(minigpt_process):
    result = minigpt_process()
    assert result.returncode == 0
    for command in ("train", "sample", "trace"):
        assert command in result.stdout


def test_version_is_answered_with_the_package_s_own_version(minigpt_process):
    from importlib.metadata import version

    import minigpt

    result = minigpt_process("--version")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"minigpt {minigpt.__version__}\n"
    assert version("minigpt") == minigpt.__version__  # pyproject reads its version from the package


def test_the_torch_the_package_asks_for_starts_at_the_release_ci_tests():
    """pyproject's floor is the torch `.ci/run` installs, so the promise is what is tested; the
    default recipe's torch.optim.Muon (2.9 and newer) is inside it, and nothing above the 2.14.1
    this workplace caps at is ever required."""
    import re
    import tomllib

    import torch

    root = Path(__file__).resolve().parents[1]
    requirement = next(
        d
        for d in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
        if d.startswith("torch")
    )
    floor, cap = re.fullmatch(r"torch>=([\d.]+),<=([\d.]+)", requirement).groups()
    installed_by_ci = re.search(r"pip install -q torch==([\d.]+)", (root / ".ci" / "run").read_text())[1]
    assert installed_by_ci.startswith(floor) and floor.count(".") == 1
    assert tuple(map(int, cap.split("."))) <= (2, 14, 1)
    assert hasattr(torch.optim, "Muon")
    assert f"torch from {floor} to {cap}" in (root / "README.md").read_text()


# ----------------------------------------------------------------------------------------------
# the flags that set a config key are built from the key's own field in config.py


def built_params(command: str) -> dict:
    """The parameters of the Click command Typer builds for `minigpt COMMAND`, by name."""
    import typer.main

    from minigpt.cli import app

    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


def help_lines(command: str) -> dict[str, str]:
    """`minigpt COMMAND --help` on a wide terminal (an option on one line), each line by its flag."""
    from typer.testing import CliRunner

    from minigpt.cli import app

    shown = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400"}).stdout
    return {line.strip(" │").split()[0]: line for line in shown.splitlines() if line.strip(" │").startswith("-")}


def assert_built_from_its_key(flag, key, section: str, shown: dict[str, str]) -> None:
    from minigpt.errors import as_flag

    name = f"[{section}] {key.name}"
    assert as_flag(key.name) in flag.opts, (name, flag.opts)
    if key.metadata["short"]:
        assert "-" + key.metadata["short"] in flag.opts, (name, flag.opts)
    if key.type == "bool":
        assert flag.secondary_opts == ["--no-" + as_flag(key.name)[2:]], (name, flag.secondary_opts)
    sentence = key.metadata["help"] + "."
    assert flag.help.lower() in (sentence.lower(), f"{sentence} Repeatable.".lower()), (name, flag.help)
    assert key.metadata["help"][1:] in " ".join(shown[as_flag(key.name)].split()), (name, "not in --help as written")


def test_every_sample_key_is_a_sample_flag_with_the_keys_own_help():
    from dataclasses import fields

    from minigpt.config import SampleConfig

    params, shown = built_params("sample"), help_lines("sample")
    for key in fields(SampleConfig):
        assert key.name in params, f"[sample] {key.name} is not a flag of minigpt sample"
        assert_built_from_its_key(params[key.name], key, "sample", shown)
    assert params["temperature"].type.convert("0.5", None, None) == 0.5  # typed as the key is
    assert params["top_k"].type.convert("7", None, None) == 7


def test_trains_config_key_flags_are_built_from_their_keys():
    from dataclasses import fields

    from minigpt.commands.options_make import TrainOptions
    from minigpt.config import ModelConfig, TrainConfig

    params, shown = built_params("train"), help_lines("train")
    keys = [key for key in fields(TrainConfig) if key.name in params]
    assert [key.name for key in keys] == [
        "data",
        "out",
        "task",
        "task_length",
        "init_from",
        "init_checkpoint",
        "exercise_file",
        "steps",
    ]
    for key in keys:
        assert_built_from_its_key(params[key.name], key, "train", shown)
    exercise = next(key for key in fields(ModelConfig) if key.name == "exercise")  # --exercise: a [model] key
    assert_built_from_its_key(params["exercise"], exercise, "model", shown)
    assert params["data"].multiple and params["steps"].type.convert("7", None, None) == 7
    given = TrainOptions(data=[Path("a.txt"), Path("b")], steps=5, quiet=True).config_values()
    assert given == {"train": {"data": [Path("a.txt"), Path("b")], "steps": 5}, "model": {}}  # what train() takes


def test_a_config_key_flag_is_checked_as_the_key_and_named_as_the_flag(minigpt_process):
    result = minigpt_process("train", "--steps", "-1", "--out", "never")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "minigpt: error: --steps -1: [train] steps = -1 must be at least 0\n"


# ----------------------------------------------------------------------------------------------
# Typer's private parts: one module


def test_the_one_module_that_reaches_into_typer_names_what_typer_raises(capsys):
    """commands/usage_errors.py takes Click's exception classes from inside typer, which has no public
    name for them: when a typer release moves them, this says so, naming the module to change."""
    import typer

    from minigpt.cli import app

    where = f"minigpt/commands/usage_errors.py (typer {typer.__version__})"
    try:
        from minigpt.commands import usage_errors
    except ImportError as exc:
        pytest.fail(f"{where} no longer finds Click's exceptions inside typer: {exc}")
    for args, kind in ((["train", "--bogus"], usage_errors.UsageError), ([], usage_errors.NoArgsIsHelpError)):
        with pytest.raises(Exception) as raised:
            app(args, standalone_mode=False)
        assert isinstance(raised.value, kind), f"{where}: typer raises {type(raised.value)}, not {kind}, for {args}"


def test_no_other_module_uses_typers_private_parts_or_forges_a_signature():
    import ast

    package = Path(__file__).resolve().parents[1] / "minigpt"
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if path.name != "usage_errors.py":
                assert not any(n.startswith(("typer._", "click")) for n in names), (path, names)
            assert not (isinstance(node, ast.Attribute) and node.attr == "__signature__"), path
