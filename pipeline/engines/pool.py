"""`EnginePool`: the rollout engines of a process, one per policy, kept alive across stages and
rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from pipeline.types import Sampler

__all__ = ["EnginePool"]


class EnginePool:
    """One sampler per policy, kept alive across stages and rounds of a process and pointed at
    the checkpoint a stage asks for (`Sampler.load_checkpoint` swaps weights in place).

    LoRA checkpoints of several policies on one base model share one engine: a policy whose
    checkpoint a live engine can serve as an adapter (`can_serve`, vLLM built with
    `enable_lora`) gets a view of that engine (`view`), which samples with its own adapter's LoRA
    request, instead of an engine of its own."""

    def __init__(self, engine: str = "auto", options: Mapping | None = None):
        self.engine = engine
        self.options = dict(options or {})
        self._samplers: dict[str, Sampler] = {}

    def get(self, policy_id: str, model_dir: str | Path) -> Sampler:
        model_dir = Path(model_dir)
        sampler = self._samplers.get(policy_id)
        if sampler is not None and Path(sampler.model_dir).resolve() == model_dir.resolve():
            return sampler
        if sampler is not None and not _is_view(sampler):
            sampler.load_checkpoint(model_dir)
            return sampler
        if sampler is not None and sampler.can_serve(model_dir):
            sampler.load_checkpoint(model_dir)
            return sampler
        self._samplers[policy_id] = sampler = self._new(model_dir)
        return sampler

    def _new(self, model_dir: Path) -> Sampler:
        from pipeline.engines import make_sampler

        for other in self._samplers.values():
            if not _is_view(other) and callable(getattr(other, "can_serve", None)) and other.can_serve(model_dir):
                return other.view(model_dir)
        return make_sampler(self.engine, model_dir, **self.options)

    def close(self) -> None:
        for s in self._samplers.values():
            s.close()
        self._samplers.clear()


def _is_view(sampler) -> bool:
    return getattr(sampler, "shared", None) is not None
