"""minigpt: train a small GPT on a text file, sample from it, and trace one position through it.

    import minigpt
    result = minigpt.train(data="my.txt", out="runs/mine", steps=200)
    run = minigpt.load("runs/mine")
    run.sample("ROMEO:", max_new_tokens=100, seed=1)
    minigpt.sweep(["model.n_layer=2,4"], "runs/depth", seeds=2)   # a grid of runs, one folder each

`load` and `train` are the Python API (minigpt/api/), the layer the command line stands on.
torch is imported when one of them is first used, not by `import minigpt`, so the command line
answers `minigpt --help` at once.
"""

from .errors import MinigptError

__version__ = "0.1.0"
__all__ = ["MinigptError", "__version__", "load", "train"]


def __getattr__(name: str):
    if name in ("load", "train", "sweep", "Run"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'minigpt' has no attribute {name!r}")
