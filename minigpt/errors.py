"""The one exception type that means "the user gave something we refuse".

The CLI prints such an error as a single line on stderr and exits non-zero; anything else is a bug
and keeps its traceback. Messages say what was given, what was expected and what to do.
"""


class MinigptError(Exception):
    """A refusal the user can act on (bad config, bad input file, too-long prompt, ...)."""


class ConfigError(MinigptError):
    """A config file or a --set override that cannot be used as given."""
