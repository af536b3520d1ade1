"""The package's shape, checked by reading its source: the import graph runs one way (commands ->
train / generate / trace -> model -> config), no library module imports the command layer, and
no library module prints to stdout, exits the process or reads sys.argv."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minigpt"
LIBRARY = sorted(p for p in PACKAGE.glob("*.py") if p.stem not in ("cli", "__main__"))

# What each library module may import from the package. Anything not listed is a new arrow in the
# graph: add it here only if it keeps the graph one-way.
ALLOWED = {
    "__init__": {"api", "errors"},  # api lazily: `import minigpt` loads no torch
    "errors": set(),
    "io": set(),
    "events": set(),
    "failpoints": {"errors"},
    "config": {"errors"},
    "device": {"errors"},
    "tokenizer": {"errors"},
    "stages": set(),
    "model": {"config", "errors", "stages"},
    "fold": {"errors", "model"},
    "chapter17": {"config", "errors", "model", "stages"},
    "sources": {"errors"},
    "token_cache": {"io"},
    "text": {"errors", "token_cache", "tokenizer"},
    "folders": {"config", "errors", "io", "sources", "text", "token_cache", "tokenizer"},
    "data": {"config", "errors", "failpoints", "folders", "io", "model", "sources", "text", "token_cache", "tokenizer"},
    "memory": {"config", "device", "errors"},
    "run": {"config", "device", "errors", "events", "failpoints", "io", "memory", "model", "sources", "tokenizer"},
    "convert": {"config", "errors", "export", "memory", "model", "run", "tokenizer"},
    "generate": {"fold", "model", "onnx_window"},  # onnx_window lazily: only with runtime = "onnxruntime"
    "onnx_window": {"errors", "model", "token_cache"},
    "flops": {"model"},
    "interventions": {"errors", "model", "stages"},
    "scoring": {"model"},
    "export": {"errors", "model", "tokenizer"},
    "plot": {"errors", "io", "trace"},
    "trace": {"errors", "interventions", "memory", "model", "stages", "tokenizer"},
    "trace_text": {"errors", "stages", "trace"},
    "explorer": {"api", "config", "device", "errors", "generate", "stages", "trace"},
    "distributed": {"errors"},
    "optimizers": {"flops", "model"},
    "threads": {"device"},
    "session": {
        "config",
        "data",
        "device",
        "distributed",
        "errors",
        "memory",
        "model",
        "optimizers",
        "run",
        "sources",
        "threads",
        "tokenizer",
    },
    "tensorboard": {"errors", "events"},
    "trainer": {
        "device",
        "distributed",
        "errors",
        "events",
        "failpoints",
        "generate",
        "model",
        "run",
        "session",
        "tensorboard",
        "threads",
    },
    "progress": {"events"},
    "api": {
        "config",
        "data",
        "device",
        "distributed",
        "errors",
        "events",
        "generate",
        "interventions",
        "model",
        "progress",
        "run",
        "scoring",
        "session",
        "tensorboard",
        "tokenizer",
        "trace",
        "trainer",
    },
}


def package_imports(path: Path) -> set[str]:
    """The minigpt modules a file imports (relative or absolute), by their first name below minigpt."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                names |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif node.level == 0 and node.module and node.module.split(".")[0] == "minigpt":
                parts = node.module.split(".")
                names |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("minigpt.")}
    return names


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_library_module_imports_only_what_lies_below_it(path):
    assert path.stem in ALLOWED, f"new module {path.stem}: place it in the import graph (ALLOWED)"
    imported = package_imports(path)
    assert "commands" not in imported and "cli" not in imported
    assert imported <= ALLOWED[path.stem], imported - ALLOWED[path.stem]


def test_the_allowed_graph_has_no_cycle():
    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, " -> ".join(trail + (name,))
        if name not in done:
            for below in ALLOWED[name]:
                visit(below, trail + (name,))
            done.add(name)

    for name in ALLOWED:
        visit(name, ())


def test_model_sits_above_config_only():
    assert package_imports(PACKAGE / "model.py") == {"config", "errors", "stages"}
    assert "model" in package_imports(PACKAGE / "trainer.py")
    assert "model" in package_imports(PACKAGE / "generate.py")
    assert "model" in package_imports(PACKAGE / "trace.py")


def test_commands_are_reached_only_from_the_cli():
    assert "commands" in package_imports(PACKAGE / "cli.py")
    for path in (PACKAGE / "commands").glob("*.py"):
        assert "cli" not in package_imports(path), path.name


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_library_module_never_prints_exits_or_reads_argv(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("print", "exit", "quit"), where
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) not in {
                ("sys", "exit"),
                ("sys", "argv"),
                ("sys", "stdout"),
                ("os", "_exit"),
                ("typer", "echo"),
                ("typer", "Exit"),
            }, where
        if isinstance(node, ast.Name):
            assert node.id != "SystemExit", where
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(m.split(".")[0] in ("typer", "click", "argparse") for m in modules), where


# ---------------------------------------------------------------- options reach their code by name

COMMAND_LAYER = [PACKAGE / "cli.py", *sorted((PACKAGE / "commands").glob("*.py"))]
# Functions that take a list of words by design (*args), not options passed along by position.
WORD_LISTS = {"command_line"}


@pytest.mark.parametrize("path", COMMAND_LAYER, ids=lambda p: p.stem)
def test_no_command_layer_call_passes_more_than_three_arguments_by_position(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name not in WORD_LISTS:
                assert len(node.args) <= 3, f"{path.name}:{node.lineno}: {name}() takes {len(node.args)} by position"


def test_every_command_takes_its_options_as_one_dataclass():
    from dataclasses import is_dataclass

    from minigpt.cli import app
    from minigpt.commands.options import COMMANDS

    names = [c.name for c in app.registered_commands]
    names += [f"{g.name} {c.name}" for g in app.registered_groups for c in g.typer_instance.registered_commands]
    assert sorted(names) == sorted(COMMANDS)
    for name, (options, module) in COMMANDS.items():
        assert is_dataclass(options) and options.__dataclass_params__.frozen, name
        source = (PACKAGE / "commands" / f"{module}.py").read_text(encoding="utf-8")
        signature = re.search(r"^def main\(o: ([\w |]+)\) -> None:", source, re.M)
        assert signature and options.__name__ in signature[1].split(" | "), name


# ---------------------------------------------------------------- the library never spells a flag

FLAG = re.compile(r"(?<![\w-])(--[a-z]|-[cpnoq](?![\w-]))")


def _strings_outside_docstrings(tree: ast.AST) -> list[tuple[int, str]]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_no_library_message_names_a_command_line_flag(path):
    """A library refusal speaks of the thing (the position, the key, the file); where it names a
    parameter it marks it with errors.option, which the command layer shows as the flag."""
    for line, text in _strings_outside_docstrings(ast.parse(path.read_text(encoding="utf-8"))):
        assert not FLAG.search(text), f"{path.name}:{line}: {text!r}"


def test_a_marked_option_is_a_flag_on_the_command_line_and_an_argument_in_the_api():
    from minigpt.errors import MinigptError, option

    error = MinigptError(f"{option('position')} 9 is beyond the prompt; try {option('set_input')} 1,2")
    assert str(error) == "position 9 is beyond the prompt; try set_input 1,2"
    assert error.for_command_line == "--position 9 is beyond the prompt; try --set-input 1,2"


def test_every_option_a_library_message_names_is_a_flag_of_some_command():
    from minigpt.commands.options import COMMANDS, annotations
    from minigpt.errors import as_flag

    flags = set()
    for options, _ in COMMANDS.values():
        for hint in annotations(options).values():
            for declared in getattr(hint, "__metadata__", ()):  # typer.Option("--data", ...): its names
                names = [getattr(declared, "default", None), *(getattr(declared, "param_decls", None) or ())]
                flags |= {flag for name in names if isinstance(name, str) for flag in name.split("/")}
    named = set()
    for path in LIBRARY:
        named |= set(re.findall(r"option\(['\"]([a-z_]+)['\"]\)", path.read_text(encoding="utf-8")))
    assert {"resume", "position", "set", "out"} <= named
    assert {as_flag(name) for name in named} <= flags, {as_flag(name) for name in named} - flags


def _sample_keys_named(node: ast.AST, keys: set[str]) -> list[str]:
    """The [sample] keys one node names together: a tuple, list, set or dict of their names, a
    call's keyword arguments, or a class's fields."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    elif isinstance(node, ast.Call):
        return [k.arg for k in node.keywords if k.arg in keys]
    elif isinstance(node, ast.ClassDef):
        return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    else:
        return []
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in keys]


def test_no_module_but_config_lists_the_sample_keys():
    """config.py's SampleConfig declares them; everything else takes the section whole (or derives
    from its fields), so adding a [sample] key is one edit there plus its use."""
    from dataclasses import fields

    from minigpt.config import SampleConfig

    keys = {f.name for f in fields(SampleConfig)}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() == "config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named = [k for k in _sample_keys_named(node, keys) if k in keys]
            assert len(set(named)) < 3, f"{path.relative_to(PACKAGE.parent)} line {node.lineno} lists [sample] {named}"
