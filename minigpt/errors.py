"""The one exception type that means "the user gave something we refuse".

The CLI prints such an error as a single line on stderr and exits non-zero; the Python API raises it
as it is; anything else is a bug and keeps its traceback. Messages say what was given, what was
expected and what to do.

A library refusal speaks of the thing it is about (the position, the run folder, the key), never of
a command-line flag: where it names a parameter the user set, it marks it with `option(name)`. The
command line shows the mark as the flag (`--position`), the Python API as the argument (`position`),
so one message serves both and the library never spells a flag.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_MARK = "\x00"  # never in a message otherwise: the marks are always rendered before anyone reads them
_MARKED = re.compile(f"{_MARK}([a-z_]+){_MARK}")


def option(name: str) -> str:
    """A parameter named in a refusal (`resume`, `position`, `set`, ...): the command line shows it
    as `--resume`, the Python API as `resume`."""
    return f"{_MARK}{name}{_MARK}"


def as_flag(name: str) -> str:
    """The command-line flag of a parameter: every option is spelled `--` + its name, hyphenated."""
    return "--" + name.replace("_", "-")


class MinigptError(Exception):
    """A refusal the user can act on (bad config, bad input file, too-long prompt, ...)."""

    exit_code = 2  # what the command line exits with: 2 for a refusal, 1 where something failed

    def render(self, name: Callable[[str], str] = lambda name: name) -> str:
        """The message with each marked parameter written by `name` (the API's own names by default)."""
        return _MARKED.sub(lambda found: name(found[1]), str(self.args[0]) if self.args else "")

    def __str__(self) -> str:
        return self.render()

    @property
    def for_command_line(self) -> str:
        return self.render(as_flag)


class ConfigError(MinigptError):
    """A config file or an override (`set`) that cannot be used as given."""
