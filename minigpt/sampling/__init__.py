"""minigpt.sampling."""
