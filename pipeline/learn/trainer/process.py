"""One training run as its own process, with what crosses the process boundary as JSON.

    python -m pipeline.learn.trainer --view VIEW.parquet --policy ID --init PARENT_DIR \\
        --out CHECKPOINT_DIR --config TRAIN_CONFIG.json [--round R] --result RESULT.json

runs `train_from_files(view, policy, init, out, config, round_=R)`: the same rows, config and
seeds as `train_policy` in the caller's process, so the same weights. It writes the checkpoint
(atomically, as `train_policy` does), then RESULT.json: the `TrainResult` as JSON
(`result_to_json`), which `result_from_json` reads back into the result the in-process call
returns (its wall-time fields, `train_seconds` and `tokens_per_second`, are the process's own).
`train_in_subprocess` does all of it for a caller: the config file, the command, the result.

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
import subprocess
import sys
import tempfile
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline.config.train import TrainConfig
from pipeline.errors import ConfigError, MaxitError, SchemaError, one_line
from pipeline.learn.trainer.train import TrainResult, train_from_files
from pipeline.store import atomic_write_text, jsonable

__all__ = [
    "config_to_json",
    "config_from_dict",
    "read_config",
    "result_to_json",
    "result_from_json",
    "train_command",
    "train_in_subprocess",
    "main",
]

PROG = "python -m pipeline.learn.trainer"


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
    *, round_: int | None = None, python: str = sys.executable,
) -> list[str]:
    """The argv of one training run as its own process (see the module docstring)."""
    argv = [python, "-m", "pipeline.learn.trainer", "--view", str(view_path), "--policy", policy_id, "--init", str(init_dir)]
    argv += ["--out", str(out_dir), "--config", str(config_path), "--result", str(result_path)]
    return argv + ([] if round_ is None else ["--round", str(round_)])


def train_in_subprocess(
    view_path: str | Path, policy_id: str, init_dir: str | Path, out_dir: str | Path, config: TrainConfig = TrainConfig(),
    *, round_: int | None = None, python: str = sys.executable, env: Mapping[str, str] | None = None,
) -> TrainResult:
    """`train_from_files(view_path, policy_id, init_dir, out_dir, config, round_=round_)` run by
    `python` in a process of its own; its result read back. A run that fails raises MaxitError
    with the process's last line of stderr (its one-line error for bad input)."""
    with tempfile.TemporaryDirectory(prefix="maxit-train-") as tmp:
        config_path, result_path = Path(tmp) / "config.json", Path(tmp) / "result.json"
        config_path.write_text(config_to_json(config), encoding="utf-8")
        argv = train_command(view_path, policy_id, init_dir, out_dir, config_path, result_path, round_=round_, python=python)
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=None if env is None else dict(env))
        if done.returncode != 0 or not result_path.is_file():
            last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise MaxitError(f"training {policy_id!r} in a subprocess failed: {last}")
        return result_from_json(result_path.read_text(encoding="utf-8"))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Train one policy on its rows of a training view, in this process.")
    ap.add_argument("--view", required=True, help="the training view (Parquet, training_view schema)")
    ap.add_argument("--policy", required=True, help="the policy id whose rows are trained on")
    ap.add_argument("--init", required=True, help="the parent checkpoint (a local model folder)")
    ap.add_argument("--out", required=True, help="the checkpoint folder to write (atomically)")
    ap.add_argument("--config", required=True, help="the TrainConfig as JSON (config_to_json; missing fields keep their defaults)")
    ap.add_argument("--result", required=True, help="the JSON file the TrainResult is written to")
    ap.add_argument("--round", type=int, default=None, help="the round of the rows (default: the view's one round)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = read_config(args.config)
        result = train_from_files(args.view, args.policy, args.init, args.out, config, round_=args.round)
        atomic_write_text(Path(args.result), result_to_json(result))
    except (MaxitError, SchemaError, FileNotFoundError) as err:
        print(f"{PROG}: error: {one_line(err)}", file=sys.stderr)
        return 2
    return 0
