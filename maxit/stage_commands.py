"""The `maxit` commands that run one stage on files, and the tools beside them: `advantages`,
`view`, `train`, `model`, `sandbox`. Each is a parser function (`add_*_parser`) and a thin call
into the library."""

from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path

from maxit.common import print_frame, print_source_notes, settings_of
from pipeline.config import AdvantageConfig
from pipeline.config.fields import literal
from pipeline.errors import DataError, MaxitError
from pipeline.run.settings import add_setting_flags

__all__ = [
    "add_advantages_parser",
    "add_view_parser",
    "add_train_parser",
    "add_model_parser",
    "add_sandbox_parser",
]


def add_advantages_parser(sub) -> None:
    p = sub.add_parser("advantages", help="recompute group advantages of stored rollouts (no generation)")
    p.add_argument("--steps", help="steps table(s): a Parquet file or a glob such as 'runs/x/round=*/steps.parquet'")
    p.add_argument("--out", required=True, help="where to write the advantages table (atomically)")
    p.add_argument("--demo", action="store_true", help="run on a generated demo table instead of --steps")
    p.add_argument("--demo-problems", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    add_advantage_flags(p)
    p.set_defaults(func=cmd_advantages)


def add_view_parser(sub) -> None:
    p = sub.add_parser("view", help="build a training view (context swap) from an advantages table")
    p.add_argument("--advantages", required=True, help="advantages Parquet file (maxit advantages --out)")
    p.add_argument("--out", required=True, help="training_view Parquet file to write (atomically)")
    p.add_argument("--model-dir", default=None, help="model whose tokenizer and chat template render the contexts (default: the embedded tiny model)")
    add_setting_flags(p, groups=(), names=VIEW_SETTINGS)
    p.add_argument("--min-reward", type=float, default=None, help="leave out rows whose reward is below this (default: the loss's: rs 1.0, the others none)")
    p.add_argument("--max-length", type=int, default=None, help="drop (and count) rows whose training prompt + completion is longer")
    p.set_defaults(func=cmd_view)


VIEW_SETTINGS = ("algorithm", "loss", "zero_advantage_rows", "balance_verdicts", "feedback_train_context", "feedback_first_attempt", "strategy_weights")
"""The settings of `maxit run` that `maxit view` takes (the rest: the algorithm's and their defaults)."""

TRAIN_SETTINGS = ("algorithm", "loss", "lr", "epochs", "train_processes", "fsdp")
"""The settings of `maxit run` that `maxit train` takes."""


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train one policy on a training view")
    p.add_argument("--view", required=True, help="training_view Parquet file")
    p.add_argument("--policy", required=True, help="policy_id whose rows are trained (e.g. shared, solver)")
    p.add_argument("--init", default=None, help="starting checkpoint (default: the embedded tiny model)")
    p.add_argument("--out", required=True, help="checkpoint folder to write (atomically)")
    add_setting_flags(p, groups=(), names=TRAIN_SETTINGS)
    p.add_argument("--temperature", type=float, default=None, help="temperature of p_train (default: the view's sampling temperature; it must match)")
    p.add_argument("--report-to", default="tensorboard")
    p.add_argument("--store", default=None, help="register the checkpoint in this store's policy registry (with --round); on a URL store the checkpoint is uploaded there")
    p.add_argument("--round", type=int, default=None, help="the round the checkpoint is registered as (with --store)")
    p.set_defaults(func=cmd_train)


def add_model_parser(sub) -> None:
    p = sub.add_parser(
        "model",
        help="build (or find) the embedded default model and print its folder; `model import FILE.gguf --out DIR`: a GGUF file as an HF model folder",
    )
    p.add_argument("action", nargs="?", choices=["import"], help="import: turn FILE.gguf into a float32 HF model folder (--out)")
    p.add_argument("file", nargs="?", metavar="FILE.gguf", help="the GGUF file to import")
    p.add_argument("--out", default=None, metavar="DIR", help="import: the model folder to write")
    p.add_argument("--chat-template", default=None, metavar="FILE", help="import: a Jinja chat template used instead of the GGUF's own")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="rebuild the default model; import: replace a non-empty --out")
    p.set_defaults(func=cmd_model)


def add_advantage_flags(p: argparse.ArgumentParser) -> None:
    """The settings of the "rewards and advantages" group (the same flags as `maxit run`'s), the
    algorithm and the loss whose presets apply, and the two numerics that only this command exposes."""
    add_setting_flags(p, groups=("rewards and advantages",), names=("algorithm", "loss"))
    g = p.add_argument_group("advantage numerics")
    g.add_argument("--singleton", choices=literal(AdvantageConfig, "singleton"), default="zero", help="advantage of a one-member group: 0, or verl's raw reward")
    g.add_argument("--eps", type=float, default=1e-6, help="added to the group std before dividing")


def advantage_config_from_args(args, settings):
    """The `AdvantageConfig` of `settings` (those of the command's flags) with the numerics only
    `maxit advantages` exposes."""
    import dataclasses

    return dataclasses.replace(settings.advantage_config(), singleton=args.singleton, eps=args.eps)


def cmd_advantages(args) -> int:
    from pipeline import store
    from pipeline.learn.advantages import advantage_metrics, compute_advantages
    from pipeline.run.settings import settings_from_args

    settings = settings_from_args(args)
    config = advantage_config_from_args(args, settings)
    store.check_writable(args.out, "--out")
    if args.demo:
        from pipeline.rollout.synthetic import synthetic_steps

        steps = synthetic_steps(n_problems=args.demo_problems, samples=4, seed=args.seed, full=True)
        source = f"a generated demo table ({steps.height} rows: {args.demo_problems} problems x 3 strategies x 4 samples x 2 agents x 3 turns)"
        if args.steps is not None:
            raise MaxitError("--demo generates its own steps table; drop --steps (or drop --demo)")
    else:
        if args.steps is None:
            raise MaxitError("--steps IN.parquet is required (or --demo to use a generated table)")
        paths = [Path(p) for p in sorted(glob.glob(args.steps))] if any(ch in args.steps for ch in "*?[") else [Path(args.steps)]
        missing = [str(p) for p in paths if not p.exists()]
        if not paths or missing:
            raise MaxitError(f"--steps: no such file: {missing[0] if missing else args.steps}")
        # every file is checked (readable Parquet, the steps contract's columns) before rows are read
        steps = store.read_tables(paths, "steps", "--steps", hive_partitioning="round=" in args.steps)
        source = ", ".join(map(str, paths))
    t0 = time.perf_counter()
    try:
        out = compute_advantages(steps, config)
    except DataError as err:  # bad rows: name the file(s) they came from
        raise (err if args.demo else DataError(f"--steps {source}: {err}")) from None
    dt = time.perf_counter() - t0
    store.write_table(out, args.out)
    print(f"advantages of {source}")
    print_source_notes("maxit advantages", settings, out["strategy"].unique().sort().to_list())
    print(
        f"algorithm {settings.algorithm}, grouping {'+'.join(config.group_key)}, normalize={config.normalize}, trajectory_mean={config.trajectory_mean} "
        f"(score: {config.trajectory_score}), reward = {config.alpha}*global + {config.local_weight}*local"
    )
    print(f"{out.height} rows in {dt:.2f} s -> {args.out}")
    print_frame(advantage_metrics(out, config), "per agent and strategy:", width=200)
    return 0


def cmd_view(args) -> int:
    import dataclasses

    from pipeline import store
    from pipeline.workflows.math.model import default_model
    from pipeline.models import load_tokenizer
    from pipeline.models.chat import check_model_dir
    from pipeline.strategies import STRATEGY_IDS, make_strategy
    from pipeline.learn.views import build_training_view

    path = Path(args.advantages)
    if not path.exists():
        raise MaxitError(f"--advantages: no such file: {path}")
    store.check_writable(args.out, "--out")
    if args.model_dir:
        check_model_dir(args.model_dir, "--model-dir")
    # the view of `maxit run` with these settings: the algorithm's and the loss's presets where a
    # flag is left alone
    settings = settings_of(args, VIEW_SETTINGS)
    config = settings.view_config()
    config = dataclasses.replace(config, max_length=args.max_length, min_reward=config.min_reward if args.min_reward is None else args.min_reward)
    adv = store.read_table(path, "advantages", flag="--advantages")  # the contract: columns, nulls, unique step_ids
    # the view validates the table (missing columns, unknown strategy ids named with their step_ids)
    options = settings.strategy_options()
    strategies = {s: make_strategy(s, **options.get(s, {})) for s in STRATEGY_IDS}
    tokenizer = load_tokenizer(args.model_dir or default_model())
    print_source_notes("maxit view", settings, sorted(set(adv["strategy"].to_list())))
    view, stats = build_training_view(adv, strategies, tokenizer, config)
    store.write_table(view, args.out, "training_view")
    print(f"{stats.n_rows} training rows of {stats.n_input} ({stats.n_context_swapped} context-swapped) -> {args.out}")
    dropped = {k: v for k, v in vars(stats).items() if k.startswith("n_") and k not in ("n_input", "n_rows", "n_context_swapped", "n_rerendered") and v}
    print(f"dropped: {dropped or 'none'}; rows per strategy: {dict(stats.by_strategy)}")
    return 0


def cmd_train(args) -> int:
    import dataclasses

    from pipeline import store
    from pipeline.models.chat import check_model_dir

    # the algorithm's and the loss's presets, as maxit run: learning rate, clip, ratio handling, negative-advantage weight;
    # the processes and their sharding checked where the run's are (ScaleConfig), each error by its flag
    run = settings_of(args, TRAIN_SETTINGS).run_config()

    init = args.init
    if init is not None:
        check_model_dir(init, "--init")
    store.check_writable(args.out, "--out", "atomic folder")
    if args.store is not None:
        if store.is_url(args.store):
            store.check_store_url(args.store, "--store")  # the checkpoint is uploaded there when registered
        else:
            store.check_writable(args.store, "--store", "folder")
    store.check_table_file(args.view, "training_view", "--view")
    if init is None:
        from pipeline.workflows.math.model import default_model

        init = default_model()
    if (args.store is None) != (args.round is None):
        raise MaxitError("--store and --round go together: give both to register the checkpoint as that round's, or neither")
    # without --temperature: the view's own sampling temperature (1.0 for a view without one)
    temperature = 1.0 if args.temperature is None else args.temperature
    config = dataclasses.replace(run.train, temperature=temperature, report_to=args.report_to)
    res = _train(args, init, config, run.scale)
    print(f"trained {res.policy_id}: {res.n_rows} rows, {res.steps} steps, mean loss {res.mean_loss:.4f}, {res.tokens_per_second:.0f} tokens/s -> {res.checkpoint}")
    if args.store is not None:
        from pipeline.store.registry import PolicyRegistry

        rec = PolicyRegistry(args.store).register(args.round, res.policy_id, res.checkpoint, parent=init, data_hash=res.data_hash)
        print(f"registered as round {rec.round} of policy {rec.policy_id!r} in {args.store}")
    return 0


def _train(args, init, config, scale):
    """`maxit train`'s run: in this process, or (`--train-processes` > 1) in a process group of its
    own whose rank 0 writes the checkpoint; this process registers it."""
    from pipeline.learn.trainer import train_from_files, train_in_subprocess

    if scale.train_processes == 1:
        return train_from_files(args.view, args.policy, init, args.out, config, round_=args.round, temperature_from_view=args.temperature is None)
    if args.temperature is None:  # the view's sampling temperature, as `train_from_files` takes it
        import dataclasses

        import pyarrow.parquet as pq

        from pipeline.learn.trainer import view_temperature

        sampled = view_temperature(pq.read_table(args.view))
        config = config if sampled is None else dataclasses.replace(config, temperature=sampled)
    return train_in_subprocess(args.view, args.policy, init, args.out, config, round_=args.round, processes=scale.train_processes, fsdp=scale.fsdp)


def cmd_model(args) -> int:
    if args.action == "import":
        from pipeline.models.importer import import_gguf

        if args.file is None or args.out is None:
            raise MaxitError("maxit model import needs FILE.gguf and --out DIR")
        res = import_gguf(args.file, args.out, chat_template=args.chat_template, force=args.force)
        print(f"imported {args.file}: {res.architecture}, {res.parameters / 1e6:.1f}M parameters, float32, chat template from {res.chat_template_source} -> {res.model_dir}")
        return 0
    if args.file is not None or args.out is not None or args.chat_template is not None:
        raise MaxitError("FILE, --out and --chat-template belong to `maxit model import FILE.gguf --out DIR`")
    from pipeline.workflows.math.model import build_default_model

    path = build_default_model(seed=args.seed, force=args.force)
    print(path)
    return 0


def add_sandbox_parser(sub) -> None:
    """`maxit sandbox run PROGRAM.py`: one untrusted program in the sandbox (pipeline/sandbox/__init__.py,
    docs/SANDBOX.md), answered with one line of JSON."""
    p = sub.add_parser("sandbox", help="run an untrusted Python program in the sandbox (docs/SANDBOX.md)")
    actions = p.add_subparsers(dest="sandbox_command", required=True)
    r = actions.add_parser(
        "run",
        help="run PROGRAM.py in the sandbox and print one line of JSON (status, exit_code, seconds, reason, isolation, user); "
        "exit code 0 when it ran, whatever the program did, 1 when the sandbox could not start it, 2 on bad input",
    )
    r.add_argument("program", metavar="PROGRAM.py")
    r.add_argument("--timeout", type=float, default=10.0, metavar="S", help="wall-clock seconds (default 10); the CPU time limit is the same, rounded up")
    r.add_argument("--memory-mb", type=int, default=512, metavar="M", help="address-space limit of the program in MB (default 512)")
    r.add_argument(
        "--allow-network-unisolated", action="store_true",
        help="run even where neither bubblewrap nor a network namespace works (otherwise refused): the program can then reach "
        "the network and every service listening on this machine (127.0.0.1 included); it still runs as an unprivileged user "
        "with its limits, but without bubblewrap it also sees every world-readable file and can write to world-writable folders such as /tmp",
    )
    r.set_defaults(func=cmd_sandbox_run)


def cmd_sandbox_run(args) -> int:
    from pipeline.sandbox import run_program

    path = Path(args.program)
    if not path.is_file():
        raise MaxitError(f"no such program file: {args.program}")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise MaxitError(f"cannot read {args.program}: {err}") from None
    result = run_program(source, timeout=args.timeout, memory_mb=args.memory_mb, allow_unisolated_network=args.allow_network_unisolated)
    print(result.to_json())
    return 1 if result.status == "error" else 0
