"""minigpt.runs."""
