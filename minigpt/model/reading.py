"""How a model is read: one frozen value, resolved once from its [model] section and the reader's
choices, that every reading of the model takes (its forward pass, sampling, trace, eval, the
explore page).

    trained_length   [model] context: the learned table's rows, or the length any other
                     model was trained at; crossed only on purpose
    own_rule         the model's own rope scaling rule ([model] rope_scaling, an imported model's):
                     always applied, as transformers applies it, inside the trained length and past it
    user_rule        a rule the reader gave (rope_scaling) to a model that has none of its own: it
                     stretches rope's rotations so that factor x trained_length tokens are accepted
    extrapolate      past the trained length on purpose (rope, alibi, t5, sinusoidal and none; a learned
                     table has no row there)
    sliding_window   [model] sliding_window: a longer text is refused however the model is read

A user rule on a model that has its own is refused naming both. Putting it in place of the model's
own rule changed the model's numbers inside its trained length (issue 45: up to 0.55 in a logit),
and no composition of two rules exists to be tested against: transformers reads one rope_scaling.

Everything a text's length is checked against lives here: `window` (the longest text accepted),
`cache_reach` (how long a KV cache stays valid), `refuse_length` (the one refusal of a text too
long, whoever notices first), `refuse_sample` (a sample that would grow past the sliding window,
refused before its first token) and `past_note` (the sentence that says what was read past the
trained length). A Reading is a value: one model read two ways at once is two Readings handed to
its forward pass (`MiniGPT.forward(reading=...)`), nothing the two share is changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import MinigptError, Phrase, parameter
from ..rope_scaling import RopeScaling, parse_rope_scaling

if TYPE_CHECKING:
    from ..config import ModelConfig


class ContextTooLongError(MinigptError):
    """A sequence longer than the model accepts: past its position table's rows (learned), or past
    the length it was trained at (every other scheme) unless the reader crosses it on purpose."""


@dataclass(frozen=True)
class Reading:
    """How one model is read (see the module): what it was trained at, and what the reader chose."""

    positions: str  # [model] positions: learned, none, rope or alibi
    trained_length: int  # [model] context
    own_rule: RopeScaling | None = None  # [model] rope_scaling: always applied
    user_rule: RopeScaling | None = None  # the reader's rope_scaling, on a model without a rule of its own
    extrapolate: bool = False  # past the trained length on purpose
    sliding_window: int = 0  # [model] sliding_window; 0: none

    @classmethod
    def of(cls, cfg: ModelConfig, extrapolate: bool = False, rope_scaling: RopeScaling | str | None = None) -> Reading:
        """The reading of a model built from `cfg`, as the reader asks (`extrapolate`, `rope_scaling`:
        a RopeScaling or its text, "yarn:4"); what cannot be read so is refused here, before any pass."""
        own = parse_rope_scaling(cfg.rope_scaling, "the model") if cfg.rope_scaling else None  # refused naming the key
        if isinstance(rope_scaling, str):
            rope_scaling = parse_rope_scaling(rope_scaling)
        if extrapolate and cfg.positions == "learned":
            raise ContextTooLongError(
                "{extrapolate:on} is refused for this model: its position table has {given} rows ([model] context "
                "= {given}) and it has no row past them to read with; only a model with positions = rope, alibi, "
                "t5, sinusoidal or none can be read past the length it was trained at",
                given=cfg.context,
            )
        if rope_scaling is not None and cfg.positions != "rope":
            raise MinigptError(
                "{rope_scaling} {given} is refused for this model: it scales rotary positions, and this model's "
                'positions are "{positions}"; use it with a model trained with positions = "rope"',
                given=str(rope_scaling),
                positions=cfg.positions,
            )
        if rope_scaling is not None and cfg.exercise == "rope":
            raise MinigptError(
                "{rope_scaling} {given} is refused for this model: its rope is a learner's (exercise rope), which "
                "turns each position by its own arithmetic and has no scaling rule to stretch; read it without "
                "{rope_scaling}, or pass {extrapolate:on} to read past its trained length ({context} tokens) on "
                "purpose",
                given=str(rope_scaling),
                context=cfg.context,
            )
        if rope_scaling is not None and own is not None:
            raise MinigptError(
                "{rope_scaling} {given} is refused for this model: it has a rope scaling rule of its own, {own} "
                "([model] rope_scaling), always applied as transformers applies it, and no way of applying a "
                "second rule with it is defined; read it without {rope_scaling} (its own rule covers its trained "
                "length, {context} tokens), or pass {extrapolate:on} to read past that length on purpose",
                given=str(rope_scaling),
                own=str(own),
                context=cfg.context,
            )
        reading = cls(cfg.positions, cfg.context, own, rope_scaling, extrapolate, cfg.sliding_window)
        rule = reading.rule
        if rule is not None and rule.kind == "dynamic" and cfg.resolved_head_width < 4:
            # its base is raised to d / (d - 2): no power at all for heads of width 2
            raise MinigptError(
                "the rope scaling rule {rule} (dynamic NTK) needs heads at least 4 wide, and this model's are "
                "{width} wide; read it with linear, yarn or llama3 instead",
                rule=str(rule),
                width=cfg.resolved_head_width,
            )
        return reading

    @property
    def rule(self) -> RopeScaling | None:
        """The one rope rule the rotations follow: the model's own, else the reader's (never both)."""
        return self.own_rule if self.own_rule is not None else self.user_rule

    @property
    def window(self) -> int | None:
        """The longest text accepted: the trained length, the reader's rule's factor x that length,
        or None (anything: extrapolate). The model's own rule covers its trained length already."""
        if self.extrapolate:
            return None
        return self.user_rule.accepts(self.trained_length) if self.user_rule is not None else self.trained_length

    @property
    def length_dependent(self) -> bool:
        """Whether a position's rotation depends on how long the text is (the dynamic rule past the
        trained length): keys rotated for a shorter text are then not the keys of a longer one."""
        return self.rule is not None and self.rule.kind == "dynamic"

    @property
    def cache_reach(self) -> int | None:
        """How long a KV cache stays valid (None: any length): the dynamic rule turns every key by the
        length of the text past the trained length, so a longer text has other keys."""
        return self.trained_length if self.length_dependent else self.window

    def refuse_length(self, length: int, what: str | Phrase, advice: str = "") -> None:
        """The one refusal of a text longer than this reading accepts, whoever notices it first (the
        forward pass, sampling, trace, eval), so that it reads the same wherever it is raised. `what`:
        the text, as the message names it; `advice`: what to do, said after the limit."""
        window = self.sliding_window
        if window and length > window:  # past it, attention reads fewer keys than minigpt's would
            raise ContextTooLongError(
                "{what} has {length} tokens but this model attends within a sliding window of {window} ([model] "
                "sliding_window = {window}): past it each position reads only the last {window} keys, which minigpt "
                "does not compute, so use at most {window} tokens",
                what=what,
                length=length,
                window=window,
            )
        window = self.window
        if window is None or length <= window:
            return
        value = f": {advice}" if advice else ""
        if self.positions == "learned":
            raise ContextTooLongError(
                "{what} has {length} tokens but the position table has {given} rows ([model] context = {given}); the "
                "model has no row for position {given} and will not invent one, so use at most {given} tokens{value}",
                what=what,
                length=length,
                given=self.trained_length,
                value=value,
            )
        reach = f" (read with rope scaling {self.user_rule}: {window} tokens)" if self.user_rule is not None else ""
        raise ContextTooLongError(
            "{what} has {length} tokens but the model was trained on at most {given} ([model] context = {given})"
            '{reach}; with positions = "{positions}" {why}, but it was never trained past '
            "that length, so use at most {window} tokens{value}, or pass {extrapolate:on} to read past it on purpose",
            what=what,
            length=length,
            given=self.trained_length,
            reach=reach,
            positions=self.positions,
            why="its fixed table is defined at every position"
            if self.positions == "sinusoidal"
            else "it has no table to run out of",
            window=window,
            value=value,
        )

    def refuse_sample(self, prompt_length: int, max_new_tokens: int, slide: bool) -> None:
        """Refuse, before any token is drawn, a sample whose text would grow past the sliding window:
        the forward pass would refuse it there, partway through. The longest text read is the prompt
        and every new token but the last, at most the window the sampler slides (`window`)."""
        window = self.sliding_window
        longest = prompt_length + max_new_tokens - 1
        if self.window is not None:
            longest = min(longest, self.window if slide else self.window - 1)
        if not window or longest <= window:
            return
        # without extrapolate the sampler reads at most the trained length (sliding, or stopping, there)
        within = self.window is None and self.trained_length <= window
        raise ContextTooLongError(
            "{max_new_tokens} {given} after a prompt of {length} tokens reads texts of up to {longest} tokens, but "
            "this model attends within a sliding window of {window} ([model] sliding_window = {window}): past it "
            "each position reads only the last {window} keys, which minigpt does not compute; so ask for at most "
            "{most} new tokens, or shorten the prompt" + (", or drop {extrapolate:on}" if within else ""),
            given=max_new_tokens,
            length=prompt_length,
            longest=longest,
            window=window,
            most=window - prompt_length + 1,
        )

    def past_note(self, verb: str, what: str) -> Phrase:
        """The sentence that says a text was read past the trained length and what let it: `verb`
        ("read", "traced") and `what` was read ("windows of 64 tokens"): the reader's rule if one
        was given, else extrapolate (nothing else lets a text past that length)."""
        how = parameter("extrapolate", "on")
        if self.user_rule is not None:
            how = Phrase("rope scaling {rule}", rule=str(self.user_rule))
        return Phrase(
            "{verb} past the trained length ({how}): {what}, and the model was trained on at most {trained}",
            verb=verb,
            how=how,
            what=what,
            trained=self.trained_length,
        )


def check_context(length: int, context: int, what: str = "the sequence", advice: str = "", positions: str = "learned"):
    """`refuse_length` of a model not yet built (training's sample prompt, checked before any
    weights exist): the same refusal, for a model trained at `context` with `positions`, read as
    it was trained."""
    Reading(positions, context).refuse_length(length, what, advice)
