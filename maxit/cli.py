"""`maxit ...`: the command line. Argument parsing lives here; every command is a thin call into
the library, and heavy modules are imported only by the command that needs them."""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

from pipeline.errors import DataError, MaxitError, RunInterrupted, SchemaError, one_line
from pipeline.run.settings import add_setting_flags, setting_default, setting_help

__all__ = ["main", "build_parser"]


def _print_frame(df, title: str | None = None, width: int = 200) -> None:
    import polars as pl

    if title:
        print(f"\n{title}")
    with pl.Config(tbl_rows=200, tbl_cols=40, tbl_width_chars=width, float_precision=3, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        print(df)


def add_advantage_flags(p: argparse.ArgumentParser) -> None:
    """The settings of the "rewards and advantages" group (the same flags as `maxit run`'s), the
    algorithm and the loss whose presets apply, and the two numerics that only this command exposes."""
    add_setting_flags(p, groups=("rewards and advantages",), names=("algorithm", "loss"))
    g = p.add_argument_group("advantage numerics")
    g.add_argument("--singleton", choices=["zero", "raw"], default="zero", help="advantage of a one-member group: 0, or verl's raw reward")
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
    _print_frame(advantage_metrics(out, config), "per agent and strategy:")
    return 0


def settings_of(args, names, **values):
    """The `Settings` of the flags `names` of a command that takes only some settings (those left
    alone, and every other setting, at their defaults: the algorithm's and the loss's presets)."""
    from pipeline.run.settings import Settings

    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return Settings(**given, **{k: v for k, v in values.items() if v is not None})


def print_source_notes(command: str, settings, strategies) -> None:
    """A note for each of `strategies` (those of the run, or of the table a command reads) that
    the algorithm's source does not sample (`pipeline.run.settings.unsourced_strategies`)."""
    from pipeline.run.settings import unsourced_strategies

    for note in unsourced_strategies(settings.algorithm, strategies, settings.reward_mix()[0]):
        print(f"{command}: note: {note}", flush=True)


def local_store(store: str, flag: str = "--store") -> Path:
    """The folder a command reads a store from: the store, or for a URL (`s3://bucket/run`) its
    local working copy, first made to hold the URL's tables (checkpoints are not downloaded)."""
    from pipeline.store import UrlStore, check_store_url, is_url

    if not is_url(store):
        return Path(store)
    check_store_url(store, flag)
    url = UrlStore(store)
    url.local.mkdir(parents=True, exist_ok=True)
    url.pull(reconcile=True)
    return url.local


def cmd_sql(args) -> int:
    from pipeline.store.analysis import run_sql
    from pipeline.store import check_table_file

    store = local_store(args.store)
    for path in sorted(store.glob("round=*/*.parquet")):
        check_table_file(path)  # a corrupt or truncated file is named, not a DuckDB traceback
    df = run_sql(args.query, store)
    _print_frame(df)
    return 0


def check_scale_out(settings, store_dir: str) -> None:
    """The scale-out settings and the store's filesystem, each a one-line error naming its flag."""
    from pipeline.errors import ConfigError
    from pipeline.store import check_store_url, is_url

    for name in ("shards", "tensor_parallel_size", "data_parallel_size", "train_processes"):
        value = getattr(settings, name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
    if getattr(settings, "train_processes", 1) > 1:
        raise ConfigError(
            "--train-processes > 1: a round's trainer under accelerate launch is planned, not built (docs/SCALING.md); "
            "`maxit train --processes N` launches one policy's training that way"
        )
    if is_url(str(store_dir)):
        check_store_url(str(store_dir), "--store")  # scheme, package, bucket, reachable: nothing written
        if str(store_dir).startswith("memory://") and getattr(settings, "shards", 1) > 1:
            raise ConfigError(
                f"--store {store_dir}: the memory filesystem is one process's, and --shards > 1 runs steps in processes of "
                "their own; use --shards 1, or a store every process can reach"
            )


def check_run_inputs(settings, store_dir: str):
    """Before any work of `maxit run` / `maxit rollout`: the workflow (imported and checked, with
    its task and prompt files), the strategies it must run, the store and the model folder of
    `settings` (a `Settings` or a `RunConfig`), each a named error. Returns the workflow."""
    from pipeline.models.chat import check_model_dir
    from pipeline.store import check_writable, is_url, working_copy
    from pipeline.run.rounds import build_workflow, run_strategies
    from pipeline.learn.views import check_verdict_training

    check_scale_out(settings, store_dir)
    config = settings.run_config() if hasattr(settings, "run_config") else settings  # a Settings or a RunConfig
    workflow = build_workflow(config)  # imports and checks the workflow; a math task reads its file
    run_strategies(config, workflow)  # strategies the workflow cannot run are named here
    check_verdict_training(getattr(workflow, "task", None), config.view)
    # a URL store is worked on in a local copy under the project's cache
    check_writable(working_copy(store_dir) if is_url(store_dir) else store_dir, "--store", "folder")
    if settings.model_dir:
        check_model_dir(settings.model_dir, "--model-dir")
    return workflow


def run_strategies_of(settings, workflow) -> list[str]:
    from pipeline.run.rounds import run_strategies

    return list(run_strategies(settings.run_config(), workflow))


def small_splits(settings, workflow) -> list[str]:
    """A line for each split that holds fewer problems than a round asks of it (a small task
    file), so that a run does not quietly train or evaluate on fewer problems than its flags say."""
    notes = []
    for split, flag, n, use in (("train", "--problems", settings.problems, "each round draws from all"),
                                ("heldout", "--eval-problems", settings.eval_problems, "every evaluation uses")):
        have = len(workflow.problems(split, n, settings.seed))
        if have < n:
            notes.append(f"maxit run: note: {flag} {n}, but the task's {split} split holds {have} problems: {use} {have}")
    return notes


def cmd_run(args) -> int:
    import resource

    from assets.config import RunSettings
    from assets.launch import run_rounds
    from pipeline.run.settings import settings_from_args

    from pipeline.run.tracking import check_targets

    settings = settings_from_args(args)
    settings.run_config()  # validate every flag before anything starts
    check_targets(settings.report_to)
    workflow = check_run_inputs(settings, args.store)
    print(
        f"maxit run: algorithm {settings.algorithm} (loss {settings.loss}), workflow {workflow.describe()}, "
        f"strategies {' '.join(run_strategies_of(settings, workflow))}",
        flush=True,
    )
    for note in small_splits(settings, workflow):
        print(note, flush=True)
    print_source_notes("maxit run", settings, run_strategies_of(settings, workflow))
    from pipeline.run.report import settings_changes
    from pipeline.store import is_url

    changes = [] if args.restart or is_url(args.store) else settings_changes(args.store, settings)
    if changes:
        print(f"maxit run: note: {args.store} last ran with other settings and holds complete rounds; this run uses "
              f"{', '.join(changes)} (experiment.json keeps the earlier values as previous_settings and previous_effective; --restart redoes every round)", flush=True)
    t0 = time.perf_counter()
    summary = run_rounds(args.rounds, args.store, RunSettings.from_settings(settings), engine=settings.engine, restart=args.restart, quiet_dagster=not args.verbose, verbose=args.verbose)
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    # the whole round table, once: as wide as it is (column names unbroken), where the lines
    # printed after each round keep to 120 characters
    _print_frame(summary, f"maxit run: {args.rounds} round(s) in {time.perf_counter() - t0:.0f}s, peak memory {peak:.0f} MB, store {args.store}", width=1000)
    return 0


def cmd_ui(args) -> int:
    from assets.launch import ui
    from pipeline.errors import ConfigError
    from pipeline.store import check_store_url, is_url

    if args.store is not None and is_url(args.store):
        check_store_url(args.store, "--store")
        if args.store.startswith("memory://"):
            raise ConfigError(f"--store {args.store}: the UI runs its steps in processes of its own, and the memory filesystem is one process's")

    return ui(host=args.host, port=args.port, store=args.store, engine=args.engine)


def cmd_runs(args) -> int:
    from pipeline.errors import ConfigError
    from pipeline.run.report import experiments_table
    from pipeline.store import is_url

    for root in args.root or []:
        if is_url(root):
            raise ConfigError(f"--root {root}: maxit runs lists local folders; for a URL store use maxit sql --store {root} or maxit report --store {root}")
    table = experiments_table(args.root or ["runs"])
    if table.is_empty():
        print(f"no stores under {', '.join(args.root or ['runs'])}")
        return 0
    import polars as pl

    with pl.Config(fmt_str_lengths=300):
        _print_frame(table.drop("settings"), f"{table.height} experiment(s)")
    print("\nsettings (those not at their default):")
    for store, settings in table.select("store", "settings").iter_rows():
        print(f"  {store}: {settings}")
    return 0


def cmd_report(args) -> int:
    from pipeline.run.report import build_report, markdown_round_table
    from pipeline.store import check_writable

    if args.out is None and not args.markdown:
        raise MaxitError("maxit report needs --out FILE.html (the HTML report) or --markdown (the round table on stdout), or both")
    if args.out is not None:
        check_writable(args.out, "--out")
    local = [local_store(s) for s in args.store]
    if args.markdown:
        # every table is made before any is printed: a bad store leaves stdout empty
        tables = [markdown_round_table(path, label=name) for path, name in zip(local, args.store)]
        print("\n\n".join(tables))
    if args.out is not None:
        out = build_report(local, args.out)
        print(f"report of {len(args.store)} store(s) -> {out}", file=sys.stderr if args.markdown else sys.stdout)
    return 0


def cmd_rollout(args) -> int:
    import polars as pl

    from pipeline.store.registry import PolicyRegistry
    from pipeline.run.rounds import RoundContext, stage_problems, stage_rollouts
    from pipeline.run.settings import settings_from_args
    from pipeline.store import UrlStore, is_url, read_table, table_path

    settings = settings_from_args(args)
    config = settings.run_config()
    if args.round < 0:
        raise MaxitError(f"--round must be >= 0, got {args.round}")
    workflow = check_run_inputs(config, args.store)
    print_source_notes("maxit rollout", settings, run_strategies_of(settings, workflow))
    url = UrlStore(args.store) if is_url(args.store) else None
    ctx = RoundContext(local_store(args.store), config, registry=PolicyRegistry(args.store))
    try:
        stage_rollouts(ctx, args.round, stage_problems(ctx, args.round))
    finally:
        ctx.engines.close()
    if url is not None:
        url.push([args.round])  # problems, steps, timings: one object each
    path = table_path(args.store, args.round, "steps")
    steps = read_table(path)
    print(f"{steps.height} agent calls -> {path}")
    _print_frame(
        steps.group_by("agent_id", "strategy").agg(pl.len().alias("rows"), pl.col("reward").mean().alias("reward_mean"), pl.col("completion_ids").list.len().mean().alias("tokens_mean")).sort("agent_id", "strategy")
    )
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
    settings = settings_of(args, ("algorithm", "loss", "balance_verdicts", "zero_advantage_rows", "feedback_train_context", "feedback_first_attempt"),
                           strategy_weights=tuple(args.strategy_weight) if args.strategy_weight else None)
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


FSDP_STRATEGIES = {"full_shard": "FULL_SHARD", "shard_grad_op": "SHARD_GRAD_OP", "hybrid_shard": "HYBRID_SHARD"}


def accelerate_argv(processes: int, fsdp: str, train_args: list[str]) -> list[str]:
    """The command that runs `maxit train train_args` under `accelerate launch` on `processes`
    processes (one per GPU), with FSDP sharding `fsdp` ("off": plain data parallel). Planned:
    built and checked here, not yet run on GPUs (see docs/SCALING.md, Trainer)."""
    from pipeline.errors import ConfigError

    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ConfigError(f"--processes must be an integer >= 1, got {processes!r}")
    if fsdp != "off" and fsdp not in FSDP_STRATEGIES:
        raise ConfigError(f"--fsdp must be off or one of {sorted(FSDP_STRATEGIES)}, got {fsdp!r}")
    argv = [str(Path(sys.executable).with_name("accelerate")), "launch", "--num_processes", str(processes)]
    if fsdp != "off":
        argv += ["--use_fsdp", "--fsdp_sharding_strategy", FSDP_STRATEGIES[fsdp], "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"]
    elif processes > 1:
        argv += ["--multi_gpu"]
    return argv + ["-m", "maxit.cli", "train", *train_args]


def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` without the given flags and their values (`--flag V` or `--flag=V`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        if any(a.startswith(f + "=") for f in flags):
            continue
        out.append(a)
    return out


def cmd_train(args) -> int:
    from pipeline import store

    if args.processes != 1 or args.fsdp != "off":
        import os

        train_args = _without(list(args.argv or []), ("--processes", "--fsdp"))
        argv = accelerate_argv(args.processes, args.fsdp, train_args)
        print("maxit train: " + " ".join(argv), flush=True)
        os.execv(argv[0], argv)  # accelerate starts one `maxit train` per process
    from pipeline.models.chat import check_model_dir
    from pipeline.config.train import TrainConfig
    from pipeline.learn.trainer import train_from_files

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
    # the algorithm's and the loss's presets, as maxit run: learning rate, clip, ratio handling, negative-advantage weight
    preset = settings_of(args, ("algorithm", "loss", "lr"))
    config = TrainConfig(lr=preset.learning_rate(), epochs=args.epochs, temperature=temperature, loss=preset.loss_config(), report_to=args.report_to)
    res = train_from_files(args.view, args.policy, init, args.out, config, round_=args.round, temperature_from_view=args.temperature is None)
    print(f"trained {res.policy_id}: {res.n_rows} rows, {res.steps} steps, mean loss {res.mean_loss:.4f}, {res.tokens_per_second:.0f} tokens/s -> {res.checkpoint}")
    if args.store is not None:
        from pipeline.store.registry import PolicyRegistry

        rec = PolicyRegistry(args.store).register(args.round, res.policy_id, res.checkpoint, parent=init, data_hash=res.data_hash)
        print(f"registered as round {rec.round} of policy {rec.policy_id!r} in {args.store}")
    return 0


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


class OneLineErrors(argparse.ArgumentParser):
    """Bad flags are reported in one line naming the flag, with a pointer to `--help`, not after
    argparse's whole usage (forty lines for `maxit run`, which push the error off a small
    terminal). Subcommands' parsers are of this class too (`add_subparsers` uses the parent's)."""

    def error(self, message: str):
        what = "commands" if self._subparsers is not None else "flags"
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the {what})\n")


def parser_given(parser: argparse.ArgumentParser, argv: list[str], unknown: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser `argv` had reached when its first unknown argument came: the
    top-level one for `maxit --x run`, `maxit sandbox run`'s for `maxit sandbox run p.py --x`."""
    current = parser
    for token in argv:
        if token in unknown:
            break
        commands = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is not None and token in commands.choices:
            current = commands.choices[token]
    return current


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(prog="maxit", description="Multi-Agent eXpert ITeration: train teams of LLM agents by expert iteration.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("advantages", help="recompute group advantages of stored rollouts (no generation)")
    p.add_argument("--steps", help="steps table(s): a Parquet file or a glob such as 'runs/x/round=*/steps.parquet'")
    p.add_argument("--out", required=True, help="where to write the advantages table (atomically)")
    p.add_argument("--demo", action="store_true", help="run on a generated demo table instead of --steps")
    p.add_argument("--demo-problems", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    add_advantage_flags(p)
    p.set_defaults(func=cmd_advantages)

    p = sub.add_parser("run", help="run N expert-iteration rounds in-process (Dagster), resuming complete rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--restart", action="store_true", help="re-run rounds that are already complete")
    p.add_argument("--verbose", action="store_true", help="print engine and library output (vLLM, Dagster, warnings) too; it always goes to STORE/maxit.log")
    p.add_argument(
        "--store", default="runs/default",
        help="folder of the run's tables and checkpoints, or a URL (s3://bucket/run, gs://bucket/run with s3fs/gcsfs installed; file://, memory://): "
        "the URL is then the store of record, the run works in a local copy under the project's cache",
    )
    add_setting_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("ui", help="the Dagster UI (dagster dev) on 127.0.0.1; Ctrl-C stops it cleanly")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument("--store", default=None, help="the store (experiment) whose rounds the UI shows and whose runs it starts write to; its Dagster instance is STORE/.dagster (default runs/default); a URL store's is in its local working copy")
    p.add_argument("--engine", choices=["auto", "vllm", "hf"], default=None)
    p.set_defaults(func=cmd_ui)

    p = sub.add_parser("runs", help="list the experiments (stores) under folders: settings, complete rounds, last accuracies")
    p.add_argument("--root", action="append", metavar="DIR", help="folder holding stores, or a store (repeat; default runs)")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser(
        "report",
        help="a self-contained HTML report of one or more stores (accuracies, success, ratios, speed, time per stage) with --out; "
        "the round table as markdown on stdout with --markdown",
    )
    p.add_argument("--store", action="append", required=True, metavar="DIR", help="a store to draw, a folder or a URL (repeat to compare; one colour each)")
    p.add_argument("--out", default=None, help="the HTML file to write")
    p.add_argument(
        "--markdown", action="store_true",
        help="print each store's round table (held-out metrics, success per strategy, training rows and steps, seconds per stage; "
        "what maxit run prints at its end) as a markdown table, after a line naming the store, workflow, algorithm and seed",
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("rollout", help="one round's problems and rollouts (what `maxit run` samples) -> DIR/round=R/steps.parquet")
    p.add_argument("--store", required=True, help="the run's folder or URL (its policy registry gives the checkpoint round R samples with)")
    p.add_argument("--round", type=int, default=0)
    add_setting_flags(p, groups=("team and task", "sampling", "rewards and advantages"))
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("view", help="build a training view (context swap) from an advantages table")
    p.add_argument("--advantages", required=True, help="advantages Parquet file (maxit advantages --out)")
    p.add_argument("--out", required=True, help="training_view Parquet file to write (atomically)")
    p.add_argument("--model-dir", default=None, help="model whose tokenizer and chat template render the contexts (default: the embedded tiny model)")
    add_setting_flags(p, groups=(), names=("algorithm", "loss", "zero_advantage_rows", "balance_verdicts", "feedback_train_context", "feedback_first_attempt"))
    p.add_argument("--min-reward", type=float, default=None, help="leave out rows whose reward is below this (default: the loss's: rs 1.0, the others none)")
    p.add_argument("--max-length", type=int, default=None, help="drop (and count) rows whose training prompt + completion is longer")
    p.add_argument(
        "--strategy-weight", action="append", metavar="S=W",
        help=f"stratified mixture weight of a strategy (repeat); {setting_help('strategy_weights').split(': ', 1)[1]}",
    )
    p.set_defaults(func=cmd_view)

    p = sub.add_parser("train", help="train one policy on a training view")
    p.add_argument("--view", required=True, help="training_view Parquet file")
    p.add_argument("--policy", required=True, help="policy_id whose rows are trained (e.g. shared, solver)")
    p.add_argument("--init", default=None, help="starting checkpoint (default: the embedded tiny model)")
    p.add_argument("--out", required=True, help="checkpoint folder to write (atomically)")
    add_setting_flags(p, groups=(), names=("algorithm", "loss", "lr"))
    p.add_argument("--epochs", type=int, default=setting_default("epochs"))
    p.add_argument("--temperature", type=float, default=None, help="temperature of p_train (default: the view's sampling temperature; it must match)")
    p.add_argument("--report-to", default="tensorboard")
    p.add_argument("--store", default=None, help="register the checkpoint in this store's policy registry (with --round); on a URL store the checkpoint is uploaded there")
    p.add_argument("--round", type=int, default=None, help="the round the checkpoint is registered as (with --store)")
    p.add_argument("--processes", type=int, default=1, help="train under `accelerate launch` on this many processes, one per GPU (planned: untested without GPUs)")
    p.add_argument("--fsdp", choices=("off", *FSDP_STRATEGIES), default="off", help="FSDP sharding under accelerate launch (planned: untested without GPUs)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("model", help="build (or find) the embedded default model and print its folder; `model import FILE.gguf --out DIR`: a GGUF file as an HF model folder")
    p.add_argument("action", nargs="?", choices=["import"], help="import: turn FILE.gguf into a float32 HF model folder (--out)")
    p.add_argument("file", nargs="?", metavar="FILE.gguf", help="the GGUF file to import")
    p.add_argument("--out", default=None, metavar="DIR", help="import: the model folder to write")
    p.add_argument("--chat-template", default=None, metavar="FILE", help="import: a Jinja chat template used instead of the GGUF's own")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="rebuild the default model; import: replace a non-empty --out")
    p.set_defaults(func=cmd_model)

    p = sub.add_parser("sql", help="SQL over every round's tables (DuckDB)")
    p.add_argument("query")
    p.add_argument("--store", default="runs/default", help="a store folder, or a URL (its tables are downloaded to its local working copy first)")
    p.set_defaults(func=cmd_sql)

    add_sandbox_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # an unknown flag is reported by the parser of the (sub)command it was given to (pointing at
    # `maxit run --help`), not by the top-level one, where argparse's parse_args would report it
    raw = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(raw)
    if unknown:
        parser_given(parser, raw, unknown).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = raw[raw.index(args.command) + 1 :] if args.command in raw else raw
    try:
        return int(args.func(args) or 0)
    except (MaxitError, SchemaError, FileNotFoundError) as err:
        print(f"maxit {args.command}: error: {one_line(err)}", file=sys.stderr)
        return 130 if isinstance(err, RunInterrupted) else 2


if __name__ == "__main__":
    raise SystemExit(main())
