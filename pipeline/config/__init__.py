"""maxit's configuration, one tree: `RunConfig` (`run.py`) nests the stage configs
(`AdvantageConfig`, `ViewConfig`, `EvalConfig` in `run.py`; `TrainConfig`, `LossConfig`,
`RatioConfig`, `LoraSettings` in `train.py`). Frozen dataclasses, each field documented where it
is declared and validated at construction."""

from pipeline.config.run import BASE_GROUP_KEY, GROUP_COLUMNS, AdvantageConfig, EvalConfig, FrozenMapping, RunConfig, ViewConfig
from pipeline.config.train import LoraSettings, LossConfig, RatioConfig, TrainConfig

__all__ = [
    "RunConfig", "AdvantageConfig", "ViewConfig", "EvalConfig", "TrainConfig", "LossConfig", "RatioConfig", "LoraSettings",
    "FrozenMapping", "GROUP_COLUMNS", "BASE_GROUP_KEY",
]
