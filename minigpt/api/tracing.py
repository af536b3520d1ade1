"""A run's traces (run.py's Run is a Tracing): `trace` and `attribute`, each a TraceRequest
answered: the request's tokens resolved against the run's tokenizer, the run to compare with
opened and checked, a patch's clean prompt run for what it puts back, then one pass (a Trace) or
two (a Comparison), with the attribution of each when asked. The trace command and the explore
page come here through `Run.trace`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import Config
from ..device import use_threads
from ..errors import MinigptError, Phrase, parameter
from ..inspection import attribution
from ..inspection.attribution import Attribution, check_decomposable
from ..inspection.comparison import Comparison
from ..inspection.comparison import compare as compare_passes
from ..inspection.interventions import PutBack, SetRow
from ..inspection.put_back import put_back_name, read_patch
from ..inspection.trace import Trace, recorded_pass, trace_position
from ..inspection.trace_input import check_ids, tokens_to_trace
from ..model.gpt import MiniGPT, check_token_ids
from ..text.tokenizer import TextTokenizer
from .trace_request import TraceRequest


class Tracing:
    """What a run traces with (Run's fields); `comparison_run` is Run's own, since it opens a run."""

    path: Path
    cfg: Config
    model: MiniGPT
    tokenizer: TextTokenizer

    def trace(self, prompt: str | TraceRequest | None = None, **keywords: Any) -> Trace | Comparison:
        """One position (default: the last) followed through every block of one forward pass: a
        Trace, or with an intervention or a comparison a Comparison of two passes. The keywords
        are TraceRequest's fields, as the trace command's flags are (a request may be passed
        whole instead of the prompt):

        - `ids` (token ids instead of a prompt), `position` (negative counts from the end), `block`
          (one block shown), `top` (next-token candidates).
        - Interventions change stages of that same pass: `scale` {"0.attention": 0.0} (or
          ["all.ffn=0.5"]), `replace_residual` [0] (or ["all"]), `ablate_head` ["0.1"], `set_input`
          [2, 2, 2, 2]; `at_position` applies the first three at the traced position only. `patch`
          {"clean": TEXT or ids, "block": B, "stage": S, "position": P or None, "head": H or None}
          puts back what the clean prompt's own pass computed there, as `patch` does (S: input,
          attention, residual1, ffn, output, any other stage of the block, or heads for head H's
          mixed values; position None: every position; the same number of tokens as the traced
          prompt). With any intervention the result is a Comparison of both passes (`compare=False`:
          the modified Trace alone).
        - `attribute` (a token's text, "#ID" or an id) adds the traced position's logit for it (minus
          `versus`'s) split into the parts that wrote it, as `attribute` returns it
          (`trace.attribution`; in a Comparison, before and after); refused at a position where a
          patch of a residual-stream row or of the attention update breaks the sum it splits.
        - `grad` adds the gradient of the loss of the traced position's next token (the prompt's, at
          the last position the model's top prediction; or `target`, a token as `attribute` takes
          it) with respect to every stage's row, through the same pass (`trace.gradient`; in a
          Comparison, each pass's, of the same target).
        - `compare_run` (a run folder, a loaded Run, or "origin": the run this one was fine-tuned
          from, `origin_run()`) gives a Comparison of two runs of one shape and tokenizer: `before`
          the compared run's pass, `after` this run's, of the same tokens, each with the same
          interventions (a patch is refused: it would put back each run's own clean activation).
          The two runs' blocks may compute in different orders (pre-norm beside post-norm, chapter
          17.6): their stages are aligned by name.
        - The chapter's exercises (17.8): `set_row` {"token_table.a": [2, 1]} (or
          ["position_table.1=0,1"]; a token by its text or "#ID") sets table rows in a copy of the
          weights; `norm_over` "positions" makes every block's norms average over the positions
          (the wrong axis, for watching); `broadcast_update` ["0.attention"] hands the residual add
          the update of position 0 alone, which it refuses; `compare_ids` gives a Comparison of
          another prompt of as many tokens (`before`) with this one (`after`), each with the
          interventions; `all_positions` adds every row stage at every position
          (`trace.all_positions`)."""
        if isinstance(prompt, TraceRequest):
            if keywords:
                raise MinigptError("give a TraceRequest or keywords, not both (the request holds every field)")
            return self._traced(prompt)
        return self._traced(TraceRequest.of(prompt=prompt, **keywords))

    def attribute(
        self,
        prompt: str | None = None,
        answer: str | int | None = None,
        *,
        ids: Sequence[int] | str | None = None,
        position: int | None = None,
        versus: str | int | None = None,
        scale: Mapping[str, float] | Sequence[str] = (),
        ablate_head: Sequence[str] = (),
        set_input: Sequence[float] | str | None = None,
        at_position: bool = False,
    ) -> Attribution:
        """The traced position's logit for `answer` (a token's text, "#ID" or an id), minus
        `versus`'s, as the sum of what each part wrote into the residual stream: the token and
        position rows, each block's heads (each through its slice of W_O) and W_O's bias, each
        block's FFN and the final norm's bias, all through the final norm with this pass's scale
        (with residual = "attention", each times its source's weight in the final norm's read over
        depth: `Part.weight`). The parts sum to the pass's own logit (`error`: by how much they
        miss it). Interventions as in `trace`, whose modified pass is then the one split."""
        if answer is None:
            raise MinigptError("give the token to attribute: {answer} TOKEN (its text, or #ID)")
        request = TraceRequest(
            prompt=prompt,
            ids=ids,
            position=position,
            scale=scale,
            ablate_head=ablate_head,
            set_input=set_input,
            at_position=at_position,
            compare=False,
        )
        changes = request.changes()
        tokens = self._attributed(answer, versus, "answer", changes)
        return self._passes(request, changes, tokens).attribution

    def _traced(self, request: TraceRequest) -> Trace | Comparison:
        """The request checked whole (fields, tokens, the compared run) before any pass, then traced."""
        changes = [self._token_row(item) if isinstance(item, SetRow) else item for item in request.changes()]
        request.check(changes)
        tokens = self._attributed(request.attribute, request.versus, "attribute", changes)
        target = self.token_id(request.target, parameter("target"))
        other = None if request.compare_run is None else self.comparison_run(request.compare_run, order_may_differ=True)
        if other is not None and tokens is not None:
            try:
                check_decomposable(other.model, changes)
            except MinigptError as exc:
                raise MinigptError("the compared run {folder}: {reason}", folder=other.path, reason=exc) from None
        before_ids = None
        if request.compare_ids is not None:
            try:
                before_ids = tokens_to_trace(self.tokenizer, None, request.compare_ids)
                check_token_ids(before_ids, self.model.vocab_size)
            except MinigptError as exc:
                raise MinigptError("{compare_ids}: {reason}", reason=exc) from None
        return self._passes(request, changes, tokens, target, other, before_ids)

    def _passes(
        self,
        request: TraceRequest,
        changes: list,
        tokens: tuple[int, int | None] | None,
        target: int | None = None,
        other: Tracing | None = None,  # the compared run
        before_ids: list[int] | None = None,
    ) -> Trace | Comparison:
        """The pass or passes a checked request asks for, with `changes` (parsed interventions),
        `tokens` (the attributed token and the one it is compared with), `target` (the gradient's),
        `other` (the compared run) and `before_ids` (the compared prompt) resolved."""
        r = request
        token_ids = tokens_to_trace(self.tokenizer, r.prompt, r.ids)
        use_threads(self.cfg.train.threads or 1)  # one forward pass of one prompt: tiny matmuls
        if r.patch is not None:  # the clean prompt's pass, recorded first
            changes = [*changes, self._put_back(r.patch, len(token_ids))]
        compare = False if r.all_positions else r.compare  # one pass, the modified one, whatever the interventions
        if other is not None or before_ids is not None or (changes and compare is not False):
            result = compare_passes(
                self.model,
                self.tokenizer,
                token_ids,
                changes,
                position=r.position,
                block=r.block,
                top=r.top,
                only_at_position=r.at_position,
                grad=r.grad,
                target=target,
                before_model=None if other is None else other.model,
                before_ids=before_ids,
            )
            if before_ids is not None:  # the other prompt's pass, then this one's, each with the changes
                traced = [(result.before, self.model, changes), (result.after, self.model, changes)]
            elif other is None:  # this run without the changes, then with them
                traced = [(result.before, self.model, []), (result.after, self.model, changes)]
            else:  # the other run's pass, then this one's, each with the changes
                result.run, result.compared_run = str(self.path), str(other.path)
                traced = [(result.before, other.model, changes), (result.after, self.model, changes)]
        else:
            result = trace_position(
                self.model,
                self.tokenizer,
                token_ids,
                position=r.position,
                block=r.block,
                top=r.top,
                interventions=changes,
                only_at_position=r.at_position,
                grad=r.grad,
                target=target,
                all_positions=r.all_positions,
            )
            traced = [(result, self.model, changes)]
        if tokens is not None:
            for one, model, applied in traced:
                one.attribution = attribution.attribute(model, self.tokenizer, one, *tokens, applied)
        return result

    # tokens named by the caller

    def token_id(self, value: str | int | None, what: Phrase) -> int | None:
        """A token given by its text, "#ID" or an id (None stays None)."""
        if value is None:
            return None
        text = f"#{value}" if isinstance(value, int) else value
        return attribution.resolve_token(self.tokenizer, text, what, self.model.vocab_size)

    def _attributed(
        self, answer: str | int | None, versus: str | int | None, name: str, changes: list
    ) -> tuple[int, int | None] | None:
        """The attributed token and the one it is compared with, as ids, checked before any pass
        (`name`: the parameter that gave the first)."""
        if answer is None:
            return None
        check_decomposable(self.model, changes)  # a post-norm model has no sum to split
        token, other = self.token_id(answer, parameter(name)), self.token_id(versus, parameter("versus"))
        if token == other:
            raise MinigptError(
                "{what} and {versus} are the same token ({token!r}); give two different tokens",
                what=parameter(name),
                token=self.tokenizer.token_text(token),
            )
        return token, other

    def _token_row(self, item: SetRow) -> SetRow:
        """A set-row of the token table with its token (text or #ID) resolved to its id."""
        if item.table != "token_table":
            return item
        if not item.row.startswith("#"):
            try:
                self.tokenizer.encode(item.row)
            except MinigptError as exc:  # a character a char tokenizer never saw: say where it came from
                raise MinigptError("{where}: {reason}", where=item.where, reason=exc) from None
        return replace(item, index=self.token_id(item.row, item.where))

    # a patch, from the clean prompt's pass

    def _put_back(self, patch: Any, length: int) -> PutBack:
        """Run.trace's `patch` ({"clean": TEXT or ids, "block", "stage", "position": P or None, "head":
        H or None}) for a traced prompt of `length` tokens, checked, as a PutBack of what the clean
        prompt's own unmodified pass computed there."""
        clean, block, stage, position, head = read_patch(patch, self.model, length)
        try:
            ids = self.tokenizer.encode(clean) if isinstance(clean, str) else list(clean)
            check_ids(self.model, ids)
        except MinigptError as exc:
            raise MinigptError("the patch's clean prompt: {reason}", reason=exc) from None
        if len(ids) != length:
            raise MinigptError(
                "the patch's clean prompt has {n_clean} tokens and the traced one {length}; a patch puts back "
                "one position's activation at the same position, so give prompts of the same token length "
                "(clean: {clean_tokens})",
                n_clean=len(ids),
                length=length,
                clean_tokens=" ".join(repr(self.tokenizer.token_text(i)) for i in ids),
            )
        values = recorded_pass(self.model, ids, {})[put_back_name(block, stage)]
        return PutBack(block, stage, position, head, values)
