"""minigpt.text."""
