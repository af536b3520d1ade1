"""Training: a session's lifetime (session.py) and where it starts (starting.py), the loop
(trainer.py) and its events (events.py), what a run writes as it trains (listeners.py), the
optimizers, the thread choice, torchrun's world (distributed.py), progress bars and TensorBoard.
"""
