"""The package's shape, checked by reading its source: the import graph runs one way (commands ->
train / generate / trace -> model -> config), no library module imports the command layer, and
no library module prints to stdout, exits the process or reads sys.argv."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minigpt"
LIBRARY = sorted(p for p in PACKAGE.glob("*.py") if p.stem not in ("cli", "__main__"))

# What each library module may import from the package. Anything not listed is a new arrow in the
# graph: add it here only if it keeps the graph one-way.
ALLOWED = {
    "__init__": set(),
    "errors": set(),
    "io": set(),
    "events": set(),
    "config": {"errors"},
    "device": {"errors"},
    "tokenizer": {"errors"},
    "stages": set(),
    "model": {"config", "errors", "stages"},
    "fold": {"errors", "model"},
    "chapter17": {"config", "errors", "model", "stages"},
    "data": {"config", "errors", "io", "model", "tokenizer"},
    "run": {"config", "device", "errors", "events", "io", "model", "tokenizer"},
    "generate": {"fold", "model"},
    "interventions": {"errors", "model", "stages"},
    "scoring": {"model"},
    "export": {"errors", "model", "tokenizer"},
    "plot": {"errors", "io", "trace"},
    "trace": {"errors", "interventions", "model", "stages", "tokenizer"},
    "trace_text": {"errors", "stages", "trace"},
    "distributed": {"errors"},
    "train": {"config", "data", "device", "distributed", "errors", "events", "generate", "model", "run", "tokenizer"},
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
    assert "model" in package_imports(PACKAGE / "train.py")
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
