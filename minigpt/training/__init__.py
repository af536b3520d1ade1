"""minigpt.training."""
