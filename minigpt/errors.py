"""The one exception type that means "the user gave something we refuse".

The CLI prints such an error as a single line on stderr and exits non-zero; the Python API raises it
as it is; anything else is a bug and keeps its traceback. Messages say what was given, what was
expected and what to do.

A refusal carries what it is about as data, and each surface says it in its own words. Its message
is a template whose fields are of two kinds:

    raise MinigptError("{position} {given} is beyond the prompt's last position {last}", given=9, last=5)

- a field given as a keyword is a value the refusal is about (`refusal.values`: the number, the
  path, what is allowed), shown as it is;
- any other field names a parameter the user set (`refusal.parameters`): the command line writes it
  as its flag (`--position`), the Python API as its argument (`position`). `{resume:on}` is a switch
  turned on: `--resume` on the command line, `resume=True` in the API.

So a library message never spells a flag, and never names a command line to run: the command layer
renders the refusal (`for_command_line`), the API's `str()` renders it for Python.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from typing import Any

# spell(parameter, spec) -> the parameter as a surface writes it; spec is "" or "on"
Spelling = Callable[[str, str], str]


def as_argument(name: str, spec: str = "") -> str:
    """A parameter as the Python API writes it: its name, or `name=True` for a switch turned on."""
    return f"{name}=True" if spec == "on" else name


def as_flag(name: str, spec: str = "") -> str:
    """A parameter as the command line writes it: every option is `--` + its name, hyphenated."""
    return "--" + name.replace("_", "-")


def fields(template: str) -> list[str]:
    """The field names of a template, in order, each once."""
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    return list(dict.fromkeys(names))


class _Parameter:
    def __init__(self, name: str, spell: Spelling):
        self.name, self.spell = name, spell

    def __format__(self, spec: str) -> str:
        return self.spell(self.name, spec)


class _Fields(Mapping):
    """The values of a template's fields: its own values (a Phrase or a refusal among them said in
    the same words), and its parameters spelled."""

    def __init__(self, values: Mapping[str, Any], spell: Spelling):
        self.values, self.spell = values, spell

    def __getitem__(self, name: str) -> Any:
        if name not in self.values:
            return _Parameter(name, self.spell)
        value = self.values[name]
        return value.render(self.spell) if isinstance(value, (Phrase, MinigptError)) else value

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def render(template: str, values: Mapping[str, Any], spell: Spelling) -> str:
    """`template` with its values shown and its parameters spelled by `spell`."""
    return template.format_map(_Fields(values, spell))


class Phrase:
    """A piece of a message that names a parameter (`Phrase("{set} {text}", text=text)`: where a
    value came from), for refusals that show it as one of their values: each surface says it in its
    own words, as it says the refusal."""

    def __init__(self, template: str, /, **values: Any):
        self.template, self.values = template, values
        render(template, values, as_argument)  # a broken template fails here, where it is written

    def render(self, spell: Spelling = as_argument) -> str:
        return render(self.template, self.values, spell)

    def __str__(self) -> str:
        return self.render(as_argument)


def parameter(name: str, spec: str = "") -> Phrase:
    """A parameter alone, as a Phrase: `parameter("set_input")` says `--set-input` or `set_input`."""
    return Phrase("{" + name + (":" + spec if spec else "") + "}")


def literal(text: str) -> str:
    """`text` as a piece of a template that shows it as it is (its braces doubled)."""
    return str(text).replace("{", "{{").replace("}", "}}")


class MinigptError(Exception):
    """A refusal the user can act on (bad config, bad input file, too-long prompt, ...): a template
    and its values (see the module's docstring)."""

    exit_code = 2  # what the command line exits with: 2 for a refusal, 1 where something failed

    def __init__(self, template: str, /, **values: Any):
        super().__init__(template)
        self.template, self.values = template, values
        self.parameters = tuple(name for name in fields(template) if name not in values)
        render(template, values, as_argument)  # a broken template fails here, where it is written

    def render(self, spell: Spelling = as_argument) -> str:
        return render(self.template, self.values, spell)

    def __str__(self) -> str:
        return self.render(as_argument)

    @property
    def for_command_line(self) -> str:
        return self.render(as_flag)


class ConfigError(MinigptError):
    """A config file or an override (`set`) that cannot be used as given."""
