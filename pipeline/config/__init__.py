"""maxit's configuration, one tree and the one source of truth for a run's settings: `RunConfig`
(`run.py`) is the whole of a run and the algorithm it follows, nesting the stage configs
(`AdvantageConfig`, `ViewConfig`, `EvalConfig` in `stages.py`; `TrainConfig`, `LoraSettings` in
`train.py`, with `LossConfig`, `RatioConfig` in `loss.py`) and where it runs and reports
(`ScaleConfig`, `TrackingConfig` in `scale.py`). Frozen dataclasses, each field documented where
it is declared and validated at construction; a combination of fields that would train the wrong
rows is refused there too.

A field a user sets declares its setting in its metadata (`fields.py`: flat name, help, group,
choices); `maxit run`'s flags, the launchpad's fields and the flat names of `RunConfig.for_algorithm`
are made from those declarations by one walk (`flat.declared`, `pipeline.run.settings`). The
algorithms' and losses' presets are in `presets.py`, in the flat names; `flat.py` puts the flat
settings on their fields.

In a notebook: `RunConfig()` is the default run, `RunConfig(algorithm="drmas")` DrMAS's, and
`RunConfig.for_algorithm("atgrpo", samples=8, alpha=0.5)` AT-GRPO's with settings over its preset."""

from pipeline.config.presets import ALGORITHM_PRESETS, ALGORITHMS, DEFAULT_MIX, LOSS_KINDS, LOSS_PRESETS, SOURCES, unsourced_strategies
from pipeline.config.run import RunConfig
from pipeline.config.scale import TRACKERS, ScaleConfig, TrackingConfig
from pipeline.config.stages import BASE_GROUP_KEY, GROUP_COLUMNS, AdvantageConfig, EvalConfig, FrozenMapping, ViewConfig
from pipeline.config.loss import LossConfig, RatioConfig
from pipeline.config.train import LoraSettings, TrainConfig

__all__ = [
    "RunConfig", "AdvantageConfig", "ViewConfig", "EvalConfig", "TrainConfig", "LossConfig", "RatioConfig", "LoraSettings",
    "ScaleConfig", "TrackingConfig", "FrozenMapping", "GROUP_COLUMNS", "BASE_GROUP_KEY", "TRACKERS",
    "ALGORITHMS", "ALGORITHM_PRESETS", "LOSS_KINDS", "LOSS_PRESETS", "DEFAULT_MIX", "SOURCES", "unsourced_strategies",
]
