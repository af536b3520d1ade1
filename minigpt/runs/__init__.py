"""The run folder: its layout, checkpoints, identity and resume checks, creation, the writer's lock,
the metrics log read back, and a run read for use.
"""
