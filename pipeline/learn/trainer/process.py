"""One training run as its own process, with what crosses the process boundary as JSON.

    python -m pipeline.learn.trainer --view VIEW.parquet --policy ID --init PARENT_DIR \\
        --out CHECKPOINT_DIR --config TRAIN_CONFIG.json [--round R] --result RESULT.json

runs `train_from_files(view, policy, init, out, config, round_=R)`: the same rows, config and
seeds as `train_policy` in the caller's process, so the same weights. It writes the checkpoint
(atomically, as `train_policy` does), then RESULT.json: the `TrainResult` as JSON
(`result_to_json`), which `result_from_json` reads back into the result the in-process call
returns (its wall-time fields, `train_seconds` and `tokens_per_second`, are the process's own).
`train_in_subprocess` does all of it for a caller: the config file, the command, the result.

With `processes` > 1 the same module runs as the ranks of one process group, started by torchrun
(`python -m torch.distributed.run`, rendezvous on 127.0.0.1) and, with `--fsdp`, shards the model
with FSDP2: the update equals one process's (`pipeline.learn.trainer.ranks`), and rank 0 alone
writes the checkpoint and RESULT.json. A cluster launcher that starts the ranks itself (torchrun
on each node, a Slurm or Kubernetes job) runs the same `-m pipeline.learn.trainer` command.

The TrainConfig crosses as JSON: `config_to_json` (its fields, nested configs as objects, as
`maxit_checkpoint.json` records them) and `config_from_dict` (LossConfig, its RatioConfigs and
LoraSettings rebuilt, each validated again at construction; an unknown field is a ConfigError
naming it and the fields the config has). Bad input exits with code 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import collections.abc
import json
import math
import re
import signal
import socket
import subprocess
import sys
import tempfile
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline.config.fields import literal
from pipeline.config.scale import ScaleConfig
from pipeline.config.train import TrainConfig
from pipeline.errors import ConfigError, MaxitError, SchemaError, one_line
from pipeline.learn.trainer.ranks import close_ranks, is_main
from pipeline.learn.trainer.train import TrainResult, train_from_files
from pipeline.store.lifeline import preexec, record_child
from pipeline.store import atomic_write_text, jsonable

__all__ = [
    "config_to_json",
    "config_from_dict",
    "read_config",
    "result_to_json",
    "result_from_json",
    "train_command",
    "FSDP_MODES",
    "train_in_subprocess",
    "main",
]

PROG = "python -m pipeline.learn.trainer"
FSDP_MODES = literal(ScaleConfig, "fsdp")


def config_to_json(config: TrainConfig) -> str:
    """`config` as JSON text: its fields by name, nested configs as objects."""
    return json.dumps(jsonable(config), indent=2, sort_keys=True)


def config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of `config_to_json`'s fields (any subset: the rest keep their defaults)."""
    return _from_dict(TrainConfig, data, "TrainConfig")


def read_config(path: str | Path) -> TrainConfig:
    """The TrainConfig in the JSON file `path`; an unreadable file is a ConfigError naming it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"--config {path}: not a readable JSON file ({err})") from None
    return config_from_dict(data)


def result_to_json(result: TrainResult) -> str:
    """`result` as JSON text (a NaN, e.g. the mean loss of a run without steps, as null)."""
    return json.dumps(jsonable(result), indent=2, sort_keys=True)


def result_from_json(text: str) -> TrainResult:
    """The TrainResult of `result_to_json`'s text."""
    return _from_dict(TrainResult, json.loads(text), "TrainResult")


def _from_dict(cls, data: Any, where: str):
    """An instance of the dataclass `cls` from a JSON object, its nested dataclasses rebuilt."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls) if f.init]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; its fields: {names}")
    return cls(**{name: _from_json(hints[name], value, f"{where}.{name}") for name, value in data.items()})


def _from_json(hint, value: Any, where: str):
    """`value` (parsed JSON) as the type `hint` names: dataclasses, `X | None`, tuples, mappings
    of dataclasses, paths; a null float is NaN (`jsonable` writes NaN as null)."""
    if value is None:
        return math.nan if hint is float else None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if is_dataclass(hint):
        return _from_dict(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _from_json(options[0], value, where) if len(options) == 1 else value
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    if origin in (collections.abc.Mapping, dict) and isinstance(value, Mapping):
        return {key: _from_json(args[1], item, f"{where}[{key!r}]") for key, item in value.items()}
    if hint is Path:
        return Path(value)
    return value


def train_command(
    view_path: str | Path, policy_id: str, init_dir: str | Path, out_dir: str | Path, config_path: str | Path, result_path: str | Path,
    *, round_: int | None = None, python: str = sys.executable, processes: int = 1, fsdp: str = "off", port: int | None = None,
) -> list[str]:
    """The argv of one training run as its own process (see the module docstring); with
    `processes` > 1, as that many ranks of one process group started by torchrun on this machine
    (its rendezvous on 127.0.0.1:`port`, default a free port), FSDP2 sharding `fsdp`."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ConfigError(f"--train-processes must be an integer >= 1, got {processes!r}")
    if fsdp not in FSDP_MODES:
        raise ConfigError(f"--fsdp must be one of {list(FSDP_MODES)}, got {fsdp!r}")
    argv = [python, "-m", "pipeline.learn.trainer"]
    if processes > 1:
        argv = [python, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(processes)]
        argv += ["--master-addr", "127.0.0.1", "--master-port", str(port or _free_port()), "-m", "pipeline.learn.trainer"]
    argv += ["--view", str(view_path), "--policy", policy_id, "--init", str(init_dir)]
    argv += ["--out", str(out_dir), "--config", str(config_path), "--result", str(result_path)]
    argv += [] if fsdp == "off" else ["--fsdp", fsdp]
    return argv + ([] if round_ is None else ["--round", str(round_)])


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_in_subprocess(
    view_path: str | Path, policy_id: str, init_dir: str | Path, out_dir: str | Path, config: TrainConfig = TrainConfig(),
    *, round_: int | None = None, python: str = sys.executable, env: Mapping[str, str] | None = None, processes: int = 1, fsdp: str = "off",
) -> TrainResult:
    """`train_from_files(view_path, policy_id, init_dir, out_dir, config, round_=round_)` run by
    `python` in a process of its own (`processes` > 1: a process group of that many ranks, FSDP2
    sharding `fsdp`; rank 0 writes the checkpoint and the result); its result read back. A run that
    fails raises MaxitError with the process's one-line error (else its last line of stderr)."""
    with tempfile.TemporaryDirectory(prefix="maxit-train-") as tmp:
        config_path, result_path = Path(tmp) / "config.json", Path(tmp) / "result.json"
        config_path.write_text(config_to_json(config), encoding="utf-8")
        argv = train_command(view_path, policy_id, init_dir, out_dir, config_path, result_path, round_=round_, python=python, processes=processes, fsdp=fsdp)
        # dies with this process (torchrun's launcher runs no maxit code to see to it itself: on
        # SIGTERM it stops its ranks, then exits); the trainer and each rank also hold the run's
        # lifeline (`pipeline.store.lifeline`) once they have started
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=None if env is None else dict(env),
                                preexec_fn=preexec(sig=signal.SIGTERM if processes > 1 else signal.SIGKILL))
        record = record_child(proc.pid, "torchrun launcher") if processes > 1 else None
        try:
            _, stderr = proc.communicate()
        finally:
            if record is not None:
                record.unlink(missing_ok=True)
        done = subprocess.CompletedProcess(argv, proc.returncode, None, stderr)
        if done.returncode != 0 or not result_path.is_file():
            last = _failure(done.stderr, done.returncode)
            raise MaxitError(f"training {policy_id!r} in {'a subprocess' if processes == 1 else f'{processes} processes'} failed: {last}")
        return result_from_json(result_path.read_text(encoding="utf-8"))


def _failure(stderr: str, returncode: int) -> str:
    """The line of a failed run's stderr that says why: a rank's one-line error, else the first
    exception line of a traceback (torchrun prefixes each rank's lines with "[rankN]: "), else
    the last line."""
    lines = [re.sub(r"^\[(?:rank|default)\d*\]:\s?", "", line) for line in stderr.strip().splitlines()]
    own = [line[len(f"{PROG}: error: "):] for line in lines if line.startswith(f"{PROG}: error: ")]
    if own:
        return own[0]
    raised = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", line)]
    if raised:  # the first: a rank's own, before the launcher's report of it
        return raised[0]
    return (lines or [f"exit code {returncode}"])[-1]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Train one policy on its rows of a training view, in this process.")
    ap.add_argument("--view", required=True, help="the training view (Parquet, training_view schema)")
    ap.add_argument("--policy", required=True, help="the policy id whose rows are trained on")
    ap.add_argument("--init", required=True, help="the parent checkpoint (a local model folder)")
    ap.add_argument("--out", required=True, help="the checkpoint folder to write (atomically)")
    ap.add_argument("--config", required=True, help="the TrainConfig as JSON (config_to_json; missing fields keep their defaults)")
    ap.add_argument("--result", required=True, help="the JSON file the TrainResult is written to")
    ap.add_argument("--round", type=int, default=None, help="the round of the rows (default: the view's one round)")
    ap.add_argument("--fsdp", choices=FSDP_MODES, default="off", help="FSDP2 sharding of the model over the ranks (run by torchrun)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = read_config(args.config)
        result = train_from_files(args.view, args.policy, args.init, args.out, config, round_=args.round, fsdp=args.fsdp)
        if is_main():  # rank 0 alone writes, as it alone wrote the checkpoint
            atomic_write_text(Path(args.result), result_to_json(result))
    except (MaxitError, SchemaError, FileNotFoundError) as err:
        print(f"{PROG}: error: {one_line(err)}", file=sys.stderr)
        return 2
    finally:
        close_ranks()
    return 0
