"""minigpt: train a small GPT on a text file, sample from it, and trace one position through it."""

__version__ = "0.1.0"
