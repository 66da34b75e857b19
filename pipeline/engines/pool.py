"""`EnginePool`: the rollout engines of a process, one per policy, kept alive across stages and
rounds."""

from __future__ import annotations

import time
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
    request, instead of an engine of its own. A run that trains LoRA adapters asks for its
    engines with `lora_rank` (`get`): they are then built able to serve adapters from the start,
    so the base model of round 0 and every later round's adapters are sampled by one engine.

    `release()` closes the engines a new checkpoint would rebuild anyway (all but LoRA-serving
    ones), so the trainer does not share the process's memory with a live engine."""

    def __init__(self, engine: str = "auto", options: Mapping | None = None):
        self.engine = engine
        self.options = dict(options or {})
        self._samplers: dict[str, Sampler] = {}
        self.start_seconds = 0.0
        """Seconds spent building new engines (the round's `engine_start` timing)."""
        self.swap_seconds = 0.0
        """Seconds spent pointing live engines at other checkpoints: a weight reload, a new adapter,
        or a rebuild the engine does itself (the round's `engine_swap` timing)."""
        self.builds = 0
        """Engines built: new ones, and the rebuilds of live ones pointed at another checkpoint
        (where the weights could not be loaded into the running engine: `EngineConfig.swap`)."""

    def get(self, policy_id: str, model_dir: str | Path, *, lora_rank: int | None = None) -> Sampler:
        """The sampler of `policy_id`, pointed at `model_dir`. `lora_rank`: the run trains LoRA
        adapters of this rank, so a new engine is built able to serve them (`enable_lora`)."""
        model_dir = Path(model_dir)
        sampler = self._samplers.get(policy_id)
        if sampler is not None and Path(sampler.model_dir).resolve() == model_dir.resolve():
            return sampler
        t0 = time.perf_counter()
        if sampler is not None and (not _is_view(sampler) or sampler.can_serve(model_dir)):
            before = getattr(sampler, "builds", 0)
            sampler.load_checkpoint(model_dir)
            self.builds += getattr(sampler, "builds", 0) - before
            self.swap_seconds += time.perf_counter() - t0
            return sampler
        self._samplers[policy_id] = sampler = self._new(model_dir, lora_rank)
        self.builds += 0 if _is_view(sampler) else 1
        self.start_seconds += time.perf_counter() - t0
        return sampler

    def _new(self, model_dir: Path, lora_rank: int | None = None) -> Sampler:
        from pipeline.engines import make_sampler

        for other in self._samplers.values():
            if not _is_view(other) and callable(getattr(other, "can_serve", None)) and other.can_serve(model_dir):
                return other.view(model_dir)
        options = dict(self.options)
        if lora_rank is not None:
            options["enable_lora"] = True
            options["max_lora_rank"] = max(int(lora_rank), int(options.get("max_lora_rank", 1)))
        return make_sampler(self.engine, model_dir, **options)

    def release(self, keep_lora: bool = True) -> list[str]:
        """Close and forget the engines that a new checkpoint would rebuild anyway: every engine
        but, with `keep_lora`, those serving LoRA adapters (a new adapter is only a new request
        on them) and the policies viewing them. The next `get` builds what it needs. Returns the
        policy ids released."""
        keep = set()
        if keep_lora:
            owners = [s for s in self._samplers.values() if not _is_view(s) and getattr(s, "lora", False) and getattr(s, "llm", None) is not None]
            keep = {pid for pid, s in self._samplers.items() if s in owners or (_is_view(s) and s.shared in owners)}
        released = [pid for pid in self._samplers if pid not in keep]
        for pid in released:
            sampler = self._samplers.pop(pid)
            if not _is_view(sampler):
                sampler.close()
        return released

    def close(self) -> None:
        for s in self._samplers.values():
            s.close()
        self._samplers.clear()


def _is_view(sampler) -> bool:
    return getattr(sampler, "shared", None) is not None
