"""Where the run's own process runs: the accelerators its engines see (`engine_devices`,
`--engine-devices`) and, beside an overlapped run's trainer, the cores its sampler keeps
(`pinned_sampler`, `--trainer-cores`)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

from pipeline.errors import MaxitError


@contextlib.contextmanager
def engine_devices(devices: str | None) -> Iterator[None]:
    """With `devices` ("0,1", `--engine-devices`): this process, and so its engines and every
    process it starts but the trainer's (`--trainer-devices`), sees only those accelerators
    (`CUDA_VISIBLE_DEVICES`, restored on exit). CUDA reads it once, when first used: a process
    that has used it already cannot be given other devices, which is an error here."""
    from pipeline.config.scale import DEVICES_ENV, devices_env

    if devices is None:
        yield
        return
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise MaxitError(f"--engine-devices {devices}: CUDA is already in use in this process; start a new one")
    before = os.environ.get(DEVICES_ENV)
    os.environ[DEVICES_ENV] = devices_env(devices)[DEVICES_ENV]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DEVICES_ENV, None)
        else:
            os.environ[DEVICES_ENV] = before


@contextlib.contextmanager
def pinned_sampler(trainer_cores: str | None) -> Iterator[None]:
    """With `trainer_cores` ("1", "2-3"): this thread (the sampler lane, and the engines it starts,
    whose threads bind to the cores they may use) pinned to the other cores meanwhile; the trainer
    lane's process is pinned to `trainer_cores` (`assets.trainer_lane.pin_to_cores`)."""
    if trainer_cores is None:
        yield
        return
    from pipeline.config.scale import parse_cores

    before = os.sched_getaffinity(0)
    mine = set(parse_cores(trainer_cores, "--trainer-cores"))
    if not mine <= before or not before - mine:
        raise MaxitError(f"--trainer-cores {trainer_cores}: this process may use cores {sorted(before)}; the trainer's must be among them "
                         "and leave the sampler at least one")
    import torch

    threads = torch.get_num_threads()
    os.sched_setaffinity(0, before - mine)
    try:
        torch.set_num_threads(len(before - mine))
        yield
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
