"""The exceptions of a command-line mistake, as the Click that Typer runs on raises them.

The one place minigpt reaches past Typer's public API. cli.main catches these to say a mistake in
one line, and Typer has no public name for them: since 0.26 it runs on its own copy of Click,
`typer._click`, and exports only `BadParameter` of it; before 0.26 it ran on Click itself.
tests/test_cli.py fails naming this module when Typer moves them.
"""

from __future__ import annotations

try:
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # typer < 0.26
    from click.exceptions import NoArgsIsHelpError, UsageError

__all__ = ["NoArgsIsHelpError", "UsageError"]
