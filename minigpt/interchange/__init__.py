"""minigpt.interchange."""
