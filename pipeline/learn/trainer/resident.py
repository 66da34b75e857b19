"""The model a trainer process keeps between rounds (the persistent trainer lane of overlapped
rounds, `assets.lane`): round r+1 trains from the checkpoint round r wrote, so a process that
trained round r still holds those weights and need not load them again.

Off unless the process asks for it (`keep_models`): a trainer that shares its device with
sampling engines (the synchronous rounds, which train in the run's own process) would otherwise
hold a second copy of the model while they sample. Kept only for a full model trained by one
process (no LoRA: the adapter is what is saved, not the model; no ranks or FSDP: no one process
holds the whole model). Taken back only for the checkpoint it was saved as, and only after every
tensor of that checkpoint on disk was compared bit for bit with the kept model's (names, dtypes,
values): anything else (a checkpoint replaced since, a resumed run, a save that changed a dtype)
loads from disk as before. A kept model is handed out once: a round that fails part-way never
leaves a half-trained model for the next.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["keep_models", "keeping_models", "keep", "take", "forget", "matches_checkpoint"]

log = logging.getLogger(__name__)


@dataclass
class _Kept:
    checkpoint: Path
    tokenizer: Any
    model: Any


_KEEP = False
_KEPT: _Kept | None = None
_STATS = {"reused": 0, "loaded": 0, "mismatched": 0}


def keep_models(on: bool = True) -> None:
    """Keep (or, False, stop keeping and drop) the model each training run of this process saves."""
    global _KEEP
    _KEEP = bool(on)
    if not on:
        forget()


def keeping_models() -> bool:
    return _KEEP


def stats() -> dict[str, int]:
    """How many runs of this process reused the kept model, loaded theirs from disk, or found the
    kept model different from the checkpoint on disk (then loaded it)."""
    return dict(_STATS)


def forget() -> None:
    global _KEPT
    _KEPT = None


def keep(checkpoint: str | Path, tokenizer, model) -> None:
    """After `model` was saved as `checkpoint`: keep it for the next run that starts there."""
    global _KEPT
    if not _KEEP:
        return
    model.zero_grad(set_to_none=True)  # the gradients are not part of the weights
    # where a freshly loaded model is (host memory, until the Trainer places it): the steps before
    # training (the proximal anchor's forward) run there on host tensors, and the trainer's device
    # is free between rounds for whatever else shares it
    model.to("cpu")
    _KEPT = _Kept(Path(checkpoint).resolve(), tokenizer, model)


def take(init_dir: str | Path) -> tuple[Any, Any] | None:
    """(tokenizer, model) of `init_dir` from the kept model, as `load_policy_model` would load it
    (float32, eval mode, no gradient checkpointing), when the kept model was saved there and
    equals its tensors on disk bit for bit; else None (the caller loads from disk)."""
    global _KEPT
    kept, _KEPT = _KEPT, None  # handed out once
    if not _KEEP:
        return None
    if kept is None or kept.checkpoint != Path(init_dir).resolve():
        _STATS["loaded"] += 1
        return None
    why = matches_checkpoint(kept.model, init_dir)
    if why is not None:
        _STATS["mismatched"] += 1
        log.warning("the model kept from the last round differs from %s (%s): loading it from disk", init_dir, why)
        return None
    model = kept.model
    if getattr(model, "is_gradient_checkpointing", False):
        model.gradient_checkpointing_disable()  # the Trainer enables it per run when asked to
    _STATS["reused"] += 1
    log.info("training from the model kept in memory, equal to %s bit for bit", init_dir)
    return kept.tokenizer, model.eval()


def matches_checkpoint(model, checkpoint: str | Path) -> str | None:
    """None when every tensor of the safetensors files of `checkpoint` equals `model`'s tensor of
    that name bit for bit (same dtype and shape) and every parameter of `model` is among them or
    shares its storage with one that is (tied weights, which `save_pretrained` writes once); else
    the first difference, in words."""
    from safetensors import safe_open

    files = sorted(Path(checkpoint).glob("*.safetensors"))
    if not files:
        return "no safetensors files"
    state = model.state_dict()
    seen: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                mine = state.get(name)
                if mine is None:
                    return f"{name} is not a tensor of the kept model"
                disk = f.get_tensor(name)
                if disk.dtype != mine.dtype or disk.shape != mine.shape:
                    return f"{name}: {disk.dtype}{tuple(disk.shape)} on disk, {mine.dtype}{tuple(mine.shape)} kept"
                if not torch.equal(disk, mine.detach().cpu()):
                    return f"{name}: other values"
                seen.add(name)
    stored = {state[n].untyped_storage().data_ptr() for n in seen}
    for name, param in model.named_parameters():
        if name not in seen and param.untyped_storage().data_ptr() not in stored:
            return f"{name} is not in the checkpoint"
    return None
