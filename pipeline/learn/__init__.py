"""Learning from the rollouts: advantages (`advantages.py`), training views (`views.py`), the
loss (`loss.py`, pure torch) and the trainer that writes one checkpoint per policy (`trainer.py`)."""
