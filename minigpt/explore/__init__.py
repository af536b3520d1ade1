"""minigpt.explore."""
