"""What a trace is asked for, as one value: the tokens and position to follow, the interventions,
the attribution, the gradient and what to compare with. `Run.trace` builds it from its keywords
(a notebook's `run.trace("ROMEO:", grad=True)`), the trace command from its flags, which carry the
same names (`TraceRequest.from_options`), and the explore page from its JSON; each then takes the
one path through tracing.py, so a flag and a keyword cannot mean two things.

The request checks what it can alone (which fields go together) before any model is read; what
needs the model (a token's text, a block's number) is checked by the pass that uses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..errors import MinigptError
from ..inspection import interventions as edits


@dataclass(frozen=True, kw_only=True)
class TraceRequest:
    """One trace's question (Run.trace documents each field); the defaults trace the last position
    of the prompt through every block, unchanged."""

    prompt: str | None = None  # or `ids`
    ids: Sequence[int] | str | None = None
    position: int | None = None  # default: the last
    block: int | None = None  # default: every block
    top: int = 5  # next-token candidates
    # interventions on the pass
    scale: Mapping[str, float] | Sequence[str] = ()
    replace_residual: Sequence[int | str] = ()
    ablate_head: Sequence[str] = ()
    set_input: Sequence[float] | str | None = None
    # the chapter's exercises: a copy of the weights, or a residual add it refuses
    set_row: Mapping[str, Sequence[float]] | Sequence[str] = ()
    norm_over: str | None = None
    broadcast_update: Sequence[str] = ()
    at_position: bool = False
    # what to compare with
    compare: bool | None = None  # None: compare whenever there is an intervention
    compare_run: Any = None  # a run folder (str or Path), a loaded Run, or "origin"
    compare_ids: Sequence[int] | str | None = None
    all_positions: bool = False
    # what else to compute at the traced position
    attribute: str | int | None = None
    versus: str | int | None = None
    patch: Mapping[str, Any] | None = None
    grad: bool = False
    target: str | int | None = None

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, **keywords: Any) -> TraceRequest:
        """A request from keywords, an unknown one refused naming those there are (a typo in a
        notebook says what it could have been, not only that it was unexpected)."""
        unknown = sorted(set(keywords) - set(cls.fields()))
        if unknown:
            raise MinigptError(
                "trace takes no {unknown}; it takes: {known}",
                unknown=", ".join(unknown),
                known=", ".join(cls.fields()),
            )
        return cls(**keywords)

    @classmethod
    def from_options(cls, options: Any) -> TraceRequest:
        """The request a command's options make: each field from the flag of its name, where one was
        given (a flag left out is None, or an empty list: the field's default then)."""
        given = {name: getattr(options, name, None) for name in cls.fields()}
        return cls(**{name: value for name, value in given.items() if value is not None})

    def changes(self) -> list:
        """The interventions as the API takes them (a mapping or texts, numbers or texts), parsed."""
        scale, set_row, set_input = self.scale, self.set_row, self.set_input
        return edits.parse(
            scale=[f"{k}={v}" for k, v in scale.items()] if isinstance(scale, Mapping) else list(scale),
            replace_residual=[str(b) for b in self.replace_residual],
            ablate_head=[str(h) for h in self.ablate_head],
            set_input=set_input if isinstance(set_input, str) or set_input is None else ",".join(map(str, set_input)),
            set_row=[f"{k}={','.join(map(str, v))}" for k, v in set_row.items()]
            if isinstance(set_row, Mapping)
            else list(set_row),
            norm_over=self.norm_over,
            broadcast_update=list(self.broadcast_update),
        )

    def check(self, changes: list) -> None:
        """Refuse fields that do not go together, before any pass (`changes`: the parsed interventions)."""
        comparing = self.compare or self.compare_run is not None
        if self.compare_ids is not None and (comparing or self.patch is not None):
            raise MinigptError(
                "{compare_ids} compares two prompts through this run; leave out {compare:on}, {compare_run} "
                "and a patch (trace them separately)"
            )
        if self.all_positions and (comparing or self.compare_ids is not None):
            raise MinigptError(
                "{all_positions:on} shows every position of one pass; a comparison shows one position of two, "
                "so give one or the other"
            )
        if self.all_positions and self.grad:
            raise MinigptError(
                "{grad:on} is the gradient of one position's loss, beside that position's rows; leave out "
                "{all_positions:on} to see it"
            )
        if self.attribute is not None and any(isinstance(item, edits.MODEL_EDITS) for item in changes):
            raise MinigptError(
                "{attribute} splits the logit of the run's own weights; {set_row} and {norm_over} change a copy "
                "of them, so trace those without {attribute}"
            )
        if self.compare_run is not None and self.compare:
            raise MinigptError(
                "{compare:on} compares a pass with and without interventions, {compare_run} two runs; give one "
                "(with {compare_run}, interventions are made in both runs' passes)"
            )
        if self.compare_run is not None and self.patch is not None:
            raise MinigptError(
                "a patch puts back one run's clean activation, so it is not made in two runs; trace the patch "
                "without {compare_run}, or compare the runs without a patch"
            )
        if self.compare and not changes and self.patch is None:
            raise MinigptError(
                "{compare:on} needs at least one intervention ({scale}, {replace_residual}, {ablate_head} or "
                "{set_input}) or a patch to compare with"
            )
        if self.versus is not None and self.attribute is None:
            raise MinigptError("{versus} is the token an attribution compares with; give {attribute} TOKEN too")
        if self.target is not None and not self.grad:
            raise MinigptError("{target} is the token whose loss a gradient differentiates; give {grad:on} too")
