"""Training stage: the loss (`loss.py`, pure torch), its configuration (`config.py`) and the
trainer that writes one checkpoint per policy (`trainer.py`)."""

from pipeline.training.config import LoraSettings, LossConfig, RatioConfig, TrainConfig

__all__ = ["LossConfig", "RatioConfig", "LoraSettings", "TrainConfig"]
