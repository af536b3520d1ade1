"""The checks of rmsnorm's second name, `residual_sublayer(x, sublayer, norm)` (lesson 09): x +
sublayer(norm(x)), checked with sublayers that record what they read and return known updates: a zero
update must leave x (replacing instead of adding), the sublayer must read norm(x) (pre-norm), the
update must be added to the untouched x (not to norm(x)), and x itself must not change (x += ...).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...model.layers import RMSNorm
from .common import Check, Probe, against, close, row


def residual_sublayer_checks(probe: Probe) -> list[Check]:
    x = torch.tensor([[[1.0, -2.0, 3.0, 0.5]]], dtype=torch.float64)
    norm = RMSNorm(4, 1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 1.0, 0.5, 1.0]))  # gains of its own: the norm handed in, not another
    normed = norm(x).detach()
    update = torch.tensor([[[0.5, 0.5, -1.0, 2.0]]], dtype=torch.float64)

    def residual_sublayer(sublayer, given: Tensor | None = None):
        given = x.clone() if given is None else given
        with torch.no_grad():
            return probe.call("residual_sublayer", probe.learner["residual_sublayer"], given, sublayer, norm)

    def zero_update() -> str | None:
        out = residual_sublayer(lambda n: torch.zeros_like(n))
        if close(out, x):
            return None
        if close(out, torch.zeros_like(x)):
            return (
                f"your residual_sublayer replaces instead of adding: with a zero update, {row(x)} became {row(out)}; "
                "return x + sublayer(norm(x)), so a sublayer with nothing to add leaves x as it is"
            )
        if close(out, normed):
            return (
                f"your residual_sublayer adds the update to norm(x), not to the untouched x: with a zero update it "
                f"returned norm(x) = {row(out)}, not x = {row(x)}"
            )
        got, want, _ = against(out, x)
        return f"with a zero update your residual_sublayer turned x = {want} into {got}: x + 0 is x"

    def reads_normalised() -> str | None:
        seen: list[Tensor] = []
        residual_sublayer(lambda n: seen.append(n.detach().clone()) or torch.zeros_like(n))
        if not seen:
            return "your residual_sublayer never calls the sublayer: its update is sublayer(norm(x))"
        if close(seen[0], x):
            return (
                "your residual_sublayer hands the sublayer x itself: it must read the normalised view "
                f"norm(x) = {row(normed)} (pre-norm)"
            )
        if not close(seen[0], normed):
            got, want, _ = against(seen[0], normed)
            return f"the sublayer received {got}; it must receive norm(x) = {want}, from the norm given"
        return None

    def keeps_input() -> str | None:
        out = residual_sublayer(lambda n: n * 0 + update)
        if close(out, x + update):
            return None
        if close(out, normed + update):
            return (
                "your residual_sublayer adds the update to norm(x), not to the untouched x (it normalises the "
                f"residual branch itself): x = {row(x)} plus {row(update)} must give {row(x + update)}"
            )
        if close(out, update):
            return f"your residual_sublayer returns only the sublayer's update {row(update)}: add it to x = {row(x)}"
        got, want, _ = against(out, x + update)
        return f"with the update {row(update)}, x = {row(x)} became {got}; x + update is {want}"

    def in_place() -> str | None:
        given = x.clone()
        residual_sublayer(lambda n: n * 0 + update, given)
        if not torch.equal(given, x):
            return (
                f"your residual_sublayer changes x in place (x += ...): the caller's x is now {row(given)}, not "
                f"{row(x)}; return a new tensor, x + update"
            )
        return None

    return [
        Check("residual_sublayer: a zero update leaves x unchanged (it adds, it does not replace)", zero_update),
        Check("residual_sublayer: the sublayer reads norm(x), the normalised view", reads_normalised),
        Check("residual_sublayer: the update is added to the untouched x", keeps_input),
        Check("residual_sublayer leaves x unchanged (no in-place edit)", in_place),
    ]
