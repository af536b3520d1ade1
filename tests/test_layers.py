"""The package's shape, checked by reading its source. The layers, top to bottom, as the Layout guide
(docs/guide/layout-and-development.md) states them:

    cli -> commands -> explore -> api -> training | sampling | inspection | interchange
        -> runs -> exercises -> text -> model
        -> the base (config, errors, io, failpoints, device, memory, counts, torch_private)

A library module imports its own subpackage and the layers below it, never one above (a peer of its
layer only where PEERS says so); the command layer stands on the API alone (beside the base, the
explore page's backend and the renderers of a trace, an attribution, a patching sweep and curves);
no module imports another in a cycle; and no library module prints to stdout, exits the process or reads sys.argv."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minigpt"
BASE = ("config", "errors", "io", "failpoints", "device", "memory", "counts", "torch_private", "rope_scaling")
LAYERS = [
    ("cli", "__main__", "__init__"),  # `python -m minigpt`, the console script and `import minigpt`
    ("commands",),
    ("explore",),
    ("api",),
    ("training", "sampling", "inspection", "interchange"),
    ("runs",),
    ("exercises",),  # a learner's module: checked against the model's own, plugged into it
    ("text",),
    ("model",),
    BASE,
]
LEVEL = {part: level for level, parts in enumerate(LAYERS) for part in parts}
PEERS = {("training", "sampling")}  # a run's samples while it trains
WHOLE = {0, len(LAYERS) - 1}  # the top and the base are one layer each: their modules import each other
# What the command layer may import besides the API: the base, the explore server's backend, and
# the renderers that turn the API's results into text and pictures.
COMMANDS_MAY_USE = {
    "api",
    "explore",
    "inspection.trace_text",
    "inspection.comparison_text",
    "inspection.feed_text",
    "inspection.text_format",
    "inspection.why_text",
    "inspection.counting_text",
    "inspection.plot",
    "inspection.sweep_plot",
    *BASE,
}


def module_name(path: Path) -> str:
    """minigpt/text/corpus.py -> "text.corpus"; minigpt/model/__init__.py -> "model"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def part_of(name: str) -> str:
    """The layer entry a module belongs to: its subpackage, or its own name at the top."""
    return name.split(".")[0]


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
LIBRARY = sorted((p for name, p in MODULES.items() if part_of(name) not in ("cli", "__main__", "commands")), key=str)


def package_imports(path: Path) -> set[str]:
    """The minigpt modules a file imports, lazy ones too, as dotted names below minigpt ("text.corpus"):
    the module itself where it is one, else the package its names come from."""
    name = module_name(path)
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    if name == "__init__":
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                origin = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.split(".")[0] == "minigpt":
                origin = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:  # `from .text import corpus` imports the module text.corpus
                candidate = ".".join([*origin, alias.name])
                found.add(candidate if candidate in MODULES else ".".join(origin) or "__init__")
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("minigpt.") for a in node.names if a.name.startswith("minigpt.")}
    return found - {name}


@pytest.mark.parametrize("path", MODULES.values(), ids=list(MODULES))
def test_every_import_goes_down_the_layers(path):
    name = module_name(path)
    if name == "__init__":  # `import minigpt`: the API, imported on first use, and the error type
        assert package_imports(path) == {"api", "errors"}
        return
    assert part_of(name) in LEVEL, f"new module {name}: place it in a layer (LAYERS)"
    for imported in package_imports(path):
        here, there = part_of(name), part_of(imported)
        assert there in LEVEL, f"{name} imports {imported}, which no layer holds"
        if here == "commands" and there != "commands":
            assert imported in COMMANDS_MAY_USE or there in COMMANDS_MAY_USE, f"{name} reaches past the API: {imported}"
        elif here != there:
            below = LEVEL[there] > LEVEL[here] or (here, there) in PEERS or LEVEL[here] == LEVEL[there] in WHOLE
            assert below, f"{name} imports {imported}, which is not below it"


# A room read in one sitting (docs/guide/layout-and-development.md): split a module that outgrows it.
MOST_LINES = 500


@pytest.mark.parametrize("path", MODULES.values(), ids=list(MODULES))
def test_no_module_is_longer_than_one_sitting(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MOST_LINES, f"{path.name} has {lines} lines; split it by job (at most {MOST_LINES})"


def test_no_module_imports_another_in_a_cycle():
    graph = {name: {m for m in package_imports(path) if m in MODULES} for name, path in MODULES.items()}
    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, " -> ".join(trail + (name,))
        if name not in done:
            for below in graph[name]:
                visit(below, trail + (name,))
            done.add(name)

    for name in graph:
        visit(name, ())


def test_the_layout_guide_states_the_layers_this_test_holds():
    guide = (PACKAGE.parent / "docs" / "guide" / "layout-and-development.md").read_text(encoding="utf-8")
    order = "cli -> commands -> explore -> api -> training | sampling | inspection | interchange"
    assert order in " ".join(guide.split())
    assert "-> runs -> exercises -> text -> model -> the base" in " ".join(guide.split())


def test_the_model_sits_on_the_base_alone():
    for name, path in MODULES.items():
        if part_of(name) == "model":
            assert {part_of(m) for m in package_imports(path)} <= {"model", *BASE}, name
    assert "model.gpt" in package_imports(MODULES["training.trainer"])
    assert "model.gpt" in package_imports(MODULES["sampling.generate"])


def test_commands_are_reached_only_from_the_cli():
    assert any(part_of(m) == "commands" for m in package_imports(MODULES["cli"]))
    for name, path in MODULES.items():
        if part_of(name) not in ("commands", "cli", "__main__"):  # __main__ runs the cli
            assert not any(part_of(m) in ("commands", "cli") for m in package_imports(path)), name


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: module_name(p))
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

    from minigpt.cli import COMMANDS, app

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


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: module_name(p))
def test_no_library_message_names_a_command_line_flag(path):
    """A library refusal speaks of the thing (the position, the key, the file); where it names a
    parameter it writes a template field ({position}), which each surface spells in its own words."""
    for line, text in _strings_outside_docstrings(ast.parse(path.read_text(encoding="utf-8"))):
        assert not FLAG.search(text), f"{path.name}:{line}: {text!r}"


def test_a_refusal_names_parameters_as_flags_on_the_command_line_and_arguments_in_the_api():
    from minigpt.errors import MinigptError, Phrase

    error = MinigptError(
        "{position} {given} is beyond the prompt; try {set_input} 1,2 or {resume:on} ({where}, {raw})",
        given=9,
        where=Phrase("{set} {text}", text="train.steps=2"),
        raw="{not a field}",
    )
    assert error.parameters == ("position", "set_input", "resume")  # what it names, as data
    assert error.values["given"] == 9
    assert str(error) == (
        "position 9 is beyond the prompt; try set_input 1,2 or resume=True (set train.steps=2, {not a field})"
    )
    assert error.for_command_line == (
        "--position 9 is beyond the prompt; try --set-input 1,2 or --resume (--set train.steps=2, {not a field})"
    )


def _refusal_templates() -> list[tuple[str, int, str, set[str]]]:
    """(module, line, template, value names) of every refusal and Phrase the library writes: the
    first argument of a call of MinigptError or one of its kinds (or a Phrase), its keywords."""
    found = []
    for path in LIBRARY:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name not in REFUSALS:
                continue
            template = _constant_text(node.args[0])
            if template is not None:
                found.append((module_name(path), node.lineno, template, {k.arg for k in node.keywords}))
    return found


REFUSALS = {
    "MinigptError",
    "ConfigError",
    "CrossCheck",  # a row of config/cross_checks.py's table: its template after "{where}: ", its values
    "Phrase",
    "ContextTooLongError",
    "TokenOutOfRangeError",
    "UnknownStageError",
    "DivergedError",
    "RankLost",
    "RefusedElsewhere",
}


def _constant_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _constant_text(node.left), _constant_text(node.right)
        return None if left is None or right is None else left + right
    return None


def test_every_parameter_a_library_message_names_is_a_flag_and_an_api_argument():
    import inspect
    import string

    import typer

    import minigpt.api as api
    from minigpt.cli import app
    from minigpt.errors import as_flag
    from minigpt.inspection import comparison_text, trace_text

    def commands(group):
        for command in getattr(group, "commands", {}).values():
            yield command
            yield from commands(command)

    flags = {opt for c in commands(typer.main.get_command(app)) for p in c.params for opt in p.opts + p.secondary_opts}
    arguments = {
        name
        # TraceRequest: Run.trace's keywords are its fields
        for function in [
            api.train,
            api.sweep,
            api.load,
            api.export,
            api.import_hf,
            api.import_nanogpt,
            api.TraceRequest,
        ]
        + [
            getattr(api.Run, m)
            for m in ("sample", "samples", "trace", "feed", "attribute", "patch", "eval", "export")
            + ("read_with", "loss_by_position", "accuracy", "accuracy_by_length")
        ]
        + [trace_text.render_text, comparison_text.render_comparison]  # the renderers a trace is shown with
        for name in inspect.signature(function).parameters
    }
    named = {}
    for module, line, template, values in _refusal_templates():
        for _, field, _, _ in string.Formatter().parse(template):
            if field and field not in values:
                named.setdefault(field, f"{module}:{line}")
    assert {"resume", "position", "set", "out", "init_from"} <= set(named)
    not_flags = {name: where for name, where in named.items() if as_flag(name) not in flags}
    assert not not_flags, not_flags
    # a parameter only the command line has (its file options) is named in the command layer alone
    not_arguments = {name: where for name, where in named.items() if name not in arguments}
    assert not not_arguments, not_arguments


def test_every_refusal_template_is_well_formed():
    from minigpt.errors import fields

    templates = _refusal_templates()
    assert len(templates) > 150  # the library's refusals, as written
    for module, line, template, values in templates:
        names = fields(template)  # a stray brace fails here, naming where it is
        assert not {v for v in values if v not in names} - {"exc"}, (module, line, template, values)


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
    """config/sample.py's SampleConfig declares them; everything else takes the section whole (or derives
    from its fields), so adding a [sample] key is one edit there plus its use."""
    from dataclasses import fields

    from minigpt.config import SampleConfig

    keys = {f.name for f in fields(SampleConfig)}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() == "config/sample.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named = [k for k in _sample_keys_named(node, keys) if k in keys]
            assert len(set(named)) < 3, f"{path.relative_to(PACKAGE.parent)} line {node.lineno} lists [sample] {named}"
