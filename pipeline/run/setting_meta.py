"""What each algorithm presets a setting to, as the setting's help says it (`preset_summary`)."""

from __future__ import annotations

from typing import Any

from pipeline.config.presets import ALGORITHM_PRESETS, ALGORITHMS, LOSS_KINDS, LOSS_PRESETS
from pipeline.config.presets import config_default as _default
from pipeline.config.loss import LossConfig

__all__ = ["preset_summary"]


_UNSET_MEANS = {
    "clip_low": f"{_default(LossConfig, 'eps_low'):g}",
    "dual_clip": "off",
    "sequence_ratio": "the loss's (mask; exit: none)",
    "hinted_rows": "as --sequence-ratio",
    "feedback_rows": "as --sequence-ratio",
    "zero_advantage_rows": "the loss's (rs: kept if rewarded; others: dropped)",
    "balance_verdicts": "the loss's (rs: on; others: off)",
}
"""What a setting an algorithm leaves unset comes to, for the settings no loss presets."""


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return " ".join(value) or "none"
    return str(value)


def preset_summary(name: str) -> str | None:
    """What each algorithm sets the setting `name` to, as its help says it ("drmas, atgrpo, grpo:
    1; exit: 0; maxit: the loss's (rs 0, ppo 0, is 1, exit 1)"), from the presets themselves; None
    for a setting that no algorithm and no loss presets."""
    if not (any(name in preset for preset in ALGORITHM_PRESETS.values()) or name in LOSS_PRESETS["rs"]):
        return None
    by_text: dict[str, list[str]] = {}
    for algorithm in ALGORITHMS:
        value = ALGORITHM_PRESETS[algorithm].get(name)
        if value is not None:
            text = _shown(value)
        elif name in LOSS_PRESETS["rs"]:
            text = "the loss's (" + ", ".join(f"{loss} {_shown(LOSS_PRESETS[loss][name])}" for loss in LOSS_KINDS) + ")"
        else:
            text = _UNSET_MEANS[name]
        by_text.setdefault(text, []).append(algorithm)
    if len(by_text) == 1:
        return next(iter(by_text))
    return "; ".join(f"{', '.join(algorithms)}: {text}" for text, algorithms in by_text.items())
