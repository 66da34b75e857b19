"""Where a run runs and where it reports: the scale-out (`ScaleConfig`: rollout shards, the vLLM
engines' parallelism, trainer processes) and the experiment trackers (`TrackingConfig`). Neither
changes a round's rows: the same run on one process or several, logged or not, trains the same
policies. Frozen dataclasses validated at construction, like the rest of the tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.fields import check_count, check_declared, setting
from pipeline.errors import ConfigError

__all__ = ["ScaleConfig", "TrackingConfig", "TRACKERS", "parse_cores", "parse_devices", "DEVICES_ENV", "devices_env"]

DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
"""The variable by which a process is given its accelerators (`engine_devices`, `trainer_devices`)."""

TRACKERS = ("tensorboard", "mlflow", "wandb")
"""The experiment trackers a run can log its rounds to (`pipeline.reporting.tracking`)."""


@dataclass(frozen=True)
class ScaleConfig:
    """How a run spreads over processes and devices (docs/SCALING.md)."""

    shards: int = field(default=1, metadata=setting(
        "shards",
        "rollout shards per round: problems split by a stable hash of uid, each shard its own Dagster step and engine; "
        "above 1 the round runs on Dagster's multiprocess executor (one process per shard); the rows do not depend on it",
        group="scale-out"))
    tensor_parallel_size: int = field(default=1, metadata=setting(
        "tensor_parallel_size", "GPUs each vLLM engine splits its layers over (vLLM's tensor_parallel_size; planned: untested without GPUs)", group="scale-out"))
    data_parallel_size: int = field(default=1, metadata=setting(
        "data_parallel_size", "engine replicas behind each vLLM engine (vLLM's data_parallel_size; planned: untested without GPUs)", group="scale-out"))
    train_processes: int = field(default=1, metadata=setting(
        "train_processes",
        "processes that train each policy (1: in the step's own process; more: a torch.distributed process group started by torchrun, "
        "gloo on a CPU, NCCL with one GPU per process on CUDA; the update equals one process's, rank 0 writes the checkpoint)",
        group="scale-out", aliases=("--processes",)))
    """Trainer processes, a torch.distributed process group started by torchrun (1: in the step's own process)."""
    fsdp: Literal["off", "full_shard", "shard_grad_op", "hybrid_shard"] = field(default="off", metadata=setting(
        "fsdp",
        "FSDP2 (fully_shard) sharding of each policy's model over its --train-processes: full_shard, shard_grad_op (parameters stay "
        "gathered between forward and backward), hybrid_shard (shards within a machine, replicas across machines); off: each process holds the whole model",
        group="scale-out"))
    """FSDP sharding of the trainer over its processes (`train_processes` > 1)."""
    executor: Literal["dagster", "ray"] = field(default="dagster", metadata=setting(
        "executor",
        "what runs the rollout shards: dagster (its own executor: one process per shard above 1) or ray (one Ray task per shard "
        "with its own engine, on --ray-address or a local Ray instance); the rows do not depend on it",
        group="scale-out"))
    """What runs the rollout shards: "dagster", Dagster's own executor (in-process for one shard,
    one process per shard above); "ray", one Ray task per shard with its own engine, on the
    cluster at `ray_address` or a local Ray instance."""
    ray_address: str | None = field(default=None, metadata=setting(
        "ray_address", "the Ray cluster of --executor ray (HOST:PORT or auto); None = a local Ray instance on 127.0.0.1", group="scale-out"))
    """The Ray cluster the shards run on (`ray.init(address=...)`, e.g. "HOST:6379" or "auto");
    None = a local Ray instance started for the run, on 127.0.0.1."""

    trainer_cores: str | None = field(default=None, metadata=setting(
        "trainer_cores",
        "with --max-staleness: the CPU cores the trainer's process is pinned to (e.g. 1, or 2-3); the sampler keeps the others. "
        "None = both share every core", group="scale-out"))
    """A core list as `parse_cores` reads it, e.g. "2-3,6"; the sampler's engines get the others."""

    engine_devices: str | None = field(default=None, metadata=setting(
        "engine_devices",
        "the accelerators (CUDA device indices, e.g. 0,1) the run's process and its engines see (CUDA_VISIBLE_DEVICES); "
        "None = every device", group="scale-out"))
    """Set in the run's own process before its first engine starts."""
    trainer_devices: str | None = field(default=None, metadata=setting(
        "trainer_devices",
        "the accelerators the trainer's own processes see (the trainer lane of --max-staleness, or torchrun's ranks of "
        "--train-processes; rank i takes the i-th); disjoint from --engine-devices", group="scale-out"))
    """The accelerators the trainer's processes see (`CUDA_VISIBLE_DEVICES` of the trainer lane of
    overlapped rounds, or of torchrun's ranks with `train_processes` > 1; rank i takes the i-th);
    disjoint from `engine_devices`. None: the trainer sees what the run's process sees."""

    def __post_init__(self) -> None:
        check_declared(self)  # fsdp and executor: their Literals
        if self.trainer_cores is not None:
            parse_cores(self.trainer_cores, "ScaleConfig.trainer_cores")
        engines = None if self.engine_devices is None else parse_devices(self.engine_devices, "ScaleConfig.engine_devices")
        trainer = None if self.trainer_devices is None else parse_devices(self.trainer_devices, "ScaleConfig.trainer_devices")
        if engines is not None and trainer is not None and set(engines) & set(trainer):
            raise ConfigError(
                f"ScaleConfig.engine_devices {self.engine_devices!r} and ScaleConfig.trainer_devices {self.trainer_devices!r} share "
                f"device(s) {sorted(set(engines) & set(trainer))}: give each its own"
            )
        if trainer is not None and isinstance(self.train_processes, int) and self.train_processes > len(trainer):
            raise ConfigError(
                f"ScaleConfig.train_processes {self.train_processes} needs a device each, but ScaleConfig.trainer_devices "
                f"{self.trainer_devices!r} names {len(trainer)}"
            )
        for name in ("shards", "tensor_parallel_size", "data_parallel_size", "train_processes"):
            check_count(f"ScaleConfig.{name}", getattr(self, name))
        if self.ray_address is not None and (self.executor != "ray" or not isinstance(self.ray_address, str) or not self.ray_address.strip()):
            raise ConfigError(
                f"ScaleConfig.ray_address {self.ray_address!r} names a Ray cluster for the shards: it needs ScaleConfig.executor 'ray' "
                f"(got {self.executor!r}) and a non-empty address"
            )
        if self.fsdp != "off" and self.train_processes == 1:
            raise ConfigError(
                f"ScaleConfig.fsdp {self.fsdp} shards the trainer over its processes, but ScaleConfig.train_processes is 1: "
                "give more processes, or leave fsdp off"
            )


def parse_cores(text: str, name: str) -> list[int]:
    """"0-2,5" -> [0, 1, 2, 5]; anything else a ConfigError naming `name`."""
    cores: set[int] = set()
    try:
        for part in str(text).split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high) if high else int(low)
            if first < 0 or last < first:
                raise ValueError(part)
            cores.update(range(first, last + 1))
    except ValueError:
        raise ConfigError(f"{name} must list CPU cores like '1' or '2-3,6', got {text!r}") from None
    return sorted(cores)


def parse_devices(text: str, name: str) -> list[int]:
    """"0,1" -> [0, 1] (device indices in the order given, each once); anything else a
    ConfigError naming `name`."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) in out:
            raise ConfigError(f"{name} must list distinct device indices like '0' or '2,3', got {text!r}")
        out.append(int(part))
    return out


def devices_env(devices: str | None, base=None) -> dict[str, str] | None:
    """The environment of a process given `devices` ("2,3"): `base` (default: this process's)
    with `DEVICES_ENV` set to them; None when `devices` is None (the process inherits)."""
    import os

    if devices is None:
        return None
    return {**(os.environ if base is None else base), DEVICES_ENV: ",".join(str(d) for d in parse_devices(devices, "devices"))}


@dataclass(frozen=True)
class TrackingConfig:
    """The experiment trackers every finished round is logged to (docs/TRACKING.md); the store
    stays the record."""

    report_to: tuple[str, ...] = field(default=(), metadata=setting(
        "report_to",
        "experiment trackers every finished round is logged to, offline and inside the store: tensorboard, mlflow, wandb "
        "(several allowed; docs/TRACKING.md); the store stays the record",
        group="evaluation", metavar="TRACKER"))
    """Trackers by name (`TRACKERS`), offline and inside the store; () or ("none",) = none.
    Whether a tracker's packages are installed is checked when a run starts
    (`pipeline.reporting.tracking.check_targets`), not here: a config may be built on another machine."""

    def __post_init__(self) -> None:
        check_declared(self)  # report_to a sequence
        targets = tuple(dict.fromkeys(self.report_to))
        if targets == ("none",):
            targets = ()
        for target in targets:
            if target not in TRACKERS:
                raise ConfigError(f"TrackingConfig.report_to {target}: unknown target; choose from {', '.join(TRACKERS)} (or none)")
        object.__setattr__(self, "report_to", targets)
