"""minigpt.inspection."""
