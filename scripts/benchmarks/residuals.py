"""`--only residuals`: Attention Residuals against the ordinary residual, `minigpt train` tokens/s
at the default shape and at 12 blocks."""

from __future__ import annotations

from pathlib import Path

from minigpt.config import load_config

from .processes import cli_tokens_per_s

RESIDUAL_MODES = {"residual": "true", "attention residuals": '"attention"'}


def residuals_benchmark(config: str | None, env: dict, scratch: Path, steps: int = 60, rounds: int = 3) -> dict:
    """Attention Residuals against the ordinary residual, as a user trains each: `minigpt train
    --set model.residual=...` (a subprocess; tokens/s over its metrics log) at the default shape
    (4 blocks) and at 12 blocks, rounds alternating between the two, the best round of each. The
    issue asks for the ratio, not a target: the mix over depth costs O(L) per layer, so the ratio
    grows with depth."""
    out: dict[str, dict[str, list[int]]] = {}
    for n_layer in (4, 12):
        shape = [f"model.n_layer={n_layer}", "train.batch_size=16"]
        per_step = load_config(config, shape).train.batch_size * load_config(config, shape).model.context
        runs: dict[str, list[float]] = {mode: [] for mode in RESIDUAL_MODES}
        for _ in range(rounds):
            for mode, value in RESIDUAL_MODES.items():
                changes = [*shape, f"model.residual={value}"]
                folder = scratch / f"residual-{n_layer}-{mode.replace(' ', '-')}"
                runs[mode].append(cli_tokens_per_s(config, changes, steps, per_step, folder, env))
        out[f"{n_layer} blocks"] = {mode: [round(x) for x in values] for mode, values in runs.items()}
    return {"train_tokens_per_s": out}


def residuals_rows(residuals: dict, row) -> None:
    for shape, runs in residuals["train_tokens_per_s"].items():
        row(
            f"train tokens/s, attention residuals, {shape} (nanoGPT column: the ordinary residual)",
            max(runs["attention residuals"]),
            max(runs["residual"]),
            "tokens/s",
            "",
        )
