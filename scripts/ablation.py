"""Ablation of the expert-iteration run on one sample budget, over several seeds.

    .venv/bin/python scripts/ablation.py [--rounds 5] [--seeds 0 1 2] [--variants rs ppo ...] [--out runs/ablation]

Every variant runs `maxit run` with the same problems x samples per round (the same sample
budget) into its own store, sequentially (the machine's cores go to one run at a time); finished
variants are reused when they ran what the variant's flags ask for now (judged by the store's
experiment.json, which records the settings and the values in effect of those left to the loss's
preset; a finished run that differs, or whose record predates those values and left a setting to
a preset that may have changed since, is an error naming it). The tables printed at the end (markdown) give, per run, held-out Solver
accuracy (T=1, no hint; other workflows: team success) per round, the gain over the starting checkpoint, the Verifier's balanced
verdict accuracy in the last round, the optimizer steps and the wall time; and per variant the
mean and spread (min..max) of the gain over the seeds.
Variants (all: iid + prompt_aug + feedback + tree, (uid, strategy, agent, turn) groups unless named).
"ppo-2e-4" is the ppo preset until the positive-half preset (lr 2e-4, negatives halved); the ppo-*
variants measured against it name it as their base, so their runs stay what docs/results/ablation-math.md reports:
  rs           rejection-sampling expert iteration (the default run)
  ppo          the ppo preset: importance-weighted PG with PPO clip, each call's own correctness as its
               reward (alpha 0), the batch baseline, positive advantages only (negative_weight 0), lr 5e-4
  ppo-2e-4     the previous ppo preset: the same with negative advantages halved, at lr 2e-4
  ppo-atgrpo   the earlier ppo preset: AT-GRPO's mixed reward (alpha 1), group baseline, full negatives, lr 2e-4
  ppo-local    ppo-atgrpo with each call's own correctness as its reward (alpha 0: no team term)
  is           the plain importance-sampling estimator (no clip), as the expert-iteration plan writes it
  sft          step-matched SFT on the reference answers (as many rows/steps as rs trains each round)
  ppo-drmas    ppo-atgrpo with DrMAS's groups (uid, strategy, agent) and its team reward (local weight 0)
  ppo-grpo     ppo-atgrpo with plain GRPO groups (uid, strategy)
  ppo-notree   ppo-2e-4 without the tree strategy (iid + prompt_aug + feedback, 5 samples each: 15 per problem vs 16)
  ppo-strat    ppo-2e-4 with stratified strategy weights (equal mixture over the four strategies)
  ppo-trunc    ppo-2e-4, hinted rows' ratios truncated at 3 instead of masked to [1/3, 3]
  ppo-noratio  ppo-2e-4, hinted rows without sequence-ratio handling
  ppo-drophint ppo-2e-4, hinted rows sampled but not trained
  no-balance   rs without equal weight for the Verifier's yes/no rows
  rs-relabel   rs with every Verifier row trained on the right verdict (relabel_verdicts)
  rs-replay    rs with the Verifier trained on its relabelled calls of every round so far (verifier_replay 5)
  ppo-replay   ppo-local with the Verifier's replay
  ppo-replay-nw  ppo-replay with negative advantages halved (negative_weight 0.5)
  ppo-local-nw ppo-local with negative advantages halved (negative_weight 0.5)
  rs-replay-sep  rs-replay with separate policies (the Verifier its own model, trained on its replay alone)
  ppo-pos-5e-4 ppo-local with positive advantages only (negative_weight 0) at lr 5e-4
  ppo-nw-5e-4  ppo-local-nw at lr 5e-4
  ppo-batch    ppo-local with the batch baseline (the round's mean reward per strategy, agent and turn)
  ppo-wideclip ppo-2e-4 without the upper clip (clip_high 10: a right sample's tokens may rise past 1.28 q)
  ppo-wide-nw25  ppo-wideclip with negative advantages at a quarter
  ppo-5e-4     ppo-2e-4 at lr 5e-4
  ppo-3e-4     ppo-2e-4 at lr 3e-4
  ppo-prox     ppo-2e-4 with the clip against the policy at the start of the round's update (proximal: decoupled PPO)
  ppo-nw25     ppo-2e-4 with negative advantages at a quarter
  is-batch     the plain importance-sampling estimator (no clip) with ppo-2e-4's reward, baseline and negatives
  ppo-5e-4-nw0   ppo-2e-4 at lr 5e-4 with positive advantages only (negative_weight 0): the ppo preset's flags
  ppo-5e-4-nw25  ppo-2e-4 at lr 5e-4 with negative advantages at a quarter
  ppo-5e-4-1ep   ppo-2e-4 at lr 5e-4, one pass over each round's rows (epochs 1)
  ppo-2e-4-nw0   ppo-2e-4 with positive advantages only
  alg-drmas, alg-atgrpo, alg-exit, alg-grpo   `--algorithm X` at the default's sample budget
  grid-atgrpo  the grid game under AT-GRPO's preset (tree, (uid, agent, turn) groups, alpha 1)
  grid-agent   grid-atgrpo with DrMAS's groups (uid, agent); grid-uid: one group per problem (uid)
  grid-iid     grid-atgrpo with independent samples instead of the tree
  grid-local   grid-atgrpo with each call's local reward only (alpha 0)
  grid-maxit   the grid game under the default algorithm (iid + prompt_aug + tree, 4 samples each: 12 per problem)
  grid-atgrpo12, grid-drmas, grid-grpo, grid-exit
               the presets on the grid game at grid-maxit's budget of 12 samples per problem and
               round (exit: iid + prompt_aug, 6 each; the game has no feedback)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.errors import DataError  # noqa: E402
from pipeline.run.experiment_record import read_experiment  # noqa: E402
from pipeline.config.presets import LOSS_PRESETS  # noqa: E402
from pipeline.run.settings import add_setting_flags, setting_default, settings_from_args  # noqa: E402
from pipeline.store import jsonable  # noqa: E402
# the ppo preset until the positive-half one: the base of the ppo-* variants measured against it
PPO_2E4 = ["--loss", "ppo", "--lr", "2e-4", "--negative-weight", "0.5"]
PG_2E4 = ["--loss", "ppo", "--lr", "2e-4"]
GRID = ["--workflow", "grid"]
# Same sample budget: the default samples 4 strategies x 4 samples per problem, so a variant with
# fewer strategies draws proportionally more samples per strategy.
VARIANTS = {
    "rs": [],
    "ppo": ["--loss", "ppo"],
    "ppo-2e-4": PPO_2E4,
    "ppo-atgrpo": [*PG_2E4, "--alpha", "1", "--baseline", "group", "--negative-weight", "1"],
    "ppo-local": [*PG_2E4, "--alpha", "0", "--baseline", "group", "--negative-weight", "1"],
    "is": ["--loss", "is"],
    "sft": ["--train-on", "ground_truth"],
    "ppo-drmas": [*PG_2E4, "--group-by", "agent_id", "--alpha", "1", "--local-weight", "0", "--baseline", "group", "--negative-weight", "1"],
    "ppo-grpo": [*PG_2E4, "--group-by", "none", "--alpha", "1", "--baseline", "group", "--negative-weight", "1"],
    "ppo-notree": [*PPO_2E4, "--strategies", "iid", "prompt_aug", "feedback", "--samples", "5"],
    "ppo-strat": [*PPO_2E4, "--strategy-weights", "iid=1", "prompt_aug=1", "feedback=1", "tree=1"],
    "ppo-trunc": [*PPO_2E4, "--hinted-rows", "truncate"],
    "ppo-noratio": [*PPO_2E4, "--hinted-rows", "none"],
    "ppo-drophint": [*PPO_2E4, "--hinted-rows", "drop"],
    "no-balance": ["--no-balance-verdicts"],
    "rs-relabel": ["--relabel-verdicts"],
    "rs-replay": ["--verifier-replay", "5"],
    "ppo-replay": [*PG_2E4, "--alpha", "0", "--verifier-replay", "5", "--baseline", "group", "--negative-weight", "1"],
    "ppo-replay-nw": [*PG_2E4, "--alpha", "0", "--verifier-replay", "5", "--negative-weight", "0.5", "--baseline", "group"],
    "ppo-local-nw": [*PG_2E4, "--alpha", "0", "--negative-weight", "0.5", "--baseline", "group"],
    "rs-replay-sep": ["--verifier-replay", "5", "--separate-policies"],
    "ppo-pos-5e-4": ["--loss", "ppo", "--alpha", "0", "--negative-weight", "0", "--lr", "5e-4", "--baseline", "group"],
    "ppo-nw-5e-4": ["--loss", "ppo", "--alpha", "0", "--negative-weight", "0.5", "--lr", "5e-4", "--baseline", "group"],
    "ppo-batch": [*PG_2E4, "--alpha", "0", "--baseline", "batch", "--negative-weight", "1"],
    "ppo-wideclip": [*PPO_2E4, "--clip-high", "10"],
    "is-batch": ["--loss", "is", "--alpha", "0", "--baseline", "batch", "--negative-weight", "0.5"],
    "ppo-wide-nw25": [*PG_2E4, "--clip-high", "10", "--negative-weight", "0.25"],
    "ppo-5e-4": ["--loss", "ppo", "--lr", "5e-4", "--negative-weight", "0.5"],
    "ppo-3e-4": ["--loss", "ppo", "--lr", "3e-4", "--negative-weight", "0.5"],
    "ppo-prox": [*PPO_2E4, "--anchor", "proximal"],
    "ppo-nw25": [*PG_2E4, "--negative-weight", "0.25"],
    "ppo-5e-4-nw0": ["--loss", "ppo", "--lr", "5e-4", "--negative-weight", "0"],
    "ppo-5e-4-nw25": ["--loss", "ppo", "--lr", "5e-4", "--negative-weight", "0.25"],
    "ppo-5e-4-1ep": ["--loss", "ppo", "--lr", "5e-4", "--negative-weight", "0.5", "--epochs", "1"],
    "ppo-2e-4-nw0": ["--loss", "ppo", "--lr", "2e-4", "--negative-weight", "0"],
    # the algorithm presets at the default's budget (16 samples per problem and round)
    "alg-drmas": ["--algorithm", "drmas", "--samples", "16"],
    "alg-atgrpo": ["--algorithm", "atgrpo", "--samples", "16"],
    "alg-exit": ["--algorithm", "exit", "--samples", "5"],
    "alg-grpo": ["--algorithm", "grpo", "--samples", "16"],
    # the grid game (--workflow grid), which of the seeds' choices pay on a stateful multi-turn
    # task: AT-GRPO (tree, (uid, agent, turn) groups, alpha 1) and one change each
    "grid-atgrpo": [*GRID, "--algorithm", "atgrpo"],
    "grid-agent": [*GRID, "--algorithm", "atgrpo", "--group-by", "agent_id"],
    "grid-uid": [*GRID, "--algorithm", "atgrpo", "--group-by", "none"],
    "grid-iid": [*GRID, "--algorithm", "atgrpo", "--strategies", "iid"],
    "grid-local": [*GRID, "--algorithm", "atgrpo", "--alpha", "0"],
    "grid-maxit": [*GRID],
    # the presets on the game at the default's budget (12 samples per problem and round)
    "grid-atgrpo12": [*GRID, "--algorithm", "atgrpo", "--samples", "12"],
    "grid-drmas": [*GRID, "--algorithm", "drmas", "--samples", "12"],
    "grid-grpo": [*GRID, "--algorithm", "grpo", "--samples", "12"],
    "grid-exit": [*GRID, "--algorithm", "exit", "--strategies", "iid", "prompt_aug", "--samples", "6"],
}


def resolved_settings(flags: list[str], seed: int) -> dict:
    """The settings a run's flags give, with the values in effect of those left to the loss's
    preset (as `maxit run` records them in the store's experiment.json: `effective`)."""
    ap = argparse.ArgumentParser(add_help=False)
    add_setting_flags(ap)
    ns, _ = ap.parse_known_args([*flags, "--seed", str(seed)])
    settings = settings_from_args(ns)
    return {**jsonable(settings), **jsonable(settings.preset_values())}


def check_reusable(store: Path, want: dict) -> None:
    """A finished run is reused only when it ran what the variant's flags ask for now, judged by
    the store's experiment.json. A store recorded before it kept the preset values in effect is
    refused when its settings left one to the preset of the day (the ppo preset changed at
    commit e215d74: an old `ppo` run is the previous preset)."""
    try:
        record = read_experiment(store) or {}
    except DataError as err:
        raise SystemExit(str(err)) from None
    stored = record.get("settings", {})
    if "effective" not in record:
        left = sorted(name for name in LOSS_PRESETS[stored.get("loss", "rs")] if stored.get(name) is None)
        if not stored or left:
            raise SystemExit(
                f"{store}: a finished run whose experiment.json does not record the values of "
                f"{', '.join(left) or 'its settings'} it ran with (left to the loss's preset, which may have changed since); "
                "move the directory away (or pass another --out) to run it again"
            )
    have = {**stored, **record.get("effective", {})}
    # a setting added after the store was made is not in its record: it ran at that setting's default
    diff = sorted(k for k in want if (have[k] if k in have else _default_of(k)) != want[k])
    if diff:
        shown = ", ".join(f"{k}: ran {have.get(k)!r}, asked {want[k]!r}" for k in diff)
        raise SystemExit(f"{store}: a finished run of other settings than this variant's ({shown}); move it away (or pass another --out) to run it again")


def _default_of(name: str):
    try:
        return jsonable(setting_default(name))
    except KeyError:  # not a setting (a value in effect of the loss's preset)
        return None


def run_variant(name: str, seed: int, rounds: int, out: Path, extra: list[str]) -> dict:
    store = out / f"{name}-seed{seed}"
    cmd = [str(ROOT / ".venv/bin/maxit"), "run", "--rounds", str(rounds), "--store", str(store), "--seed", str(seed), *VARIANTS[name], *extra]
    want = resolved_settings([*VARIANTS[name], *extra], seed)
    t0 = time.perf_counter()
    log = out / f"{name}-seed{seed}.log"
    if (store / f"round={rounds - 1}" / "evaluation.parquet").exists() and (out / f"{name}-seed{seed}.seconds").exists():
        check_reusable(store, want)
        seconds = float((out / f"{name}-seed{seed}.seconds").read_text())
        return _result(name, seed, store, seconds, cmd)
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"variant": name, "seed": seed, "error": f"exit {proc.returncode}, see {log}", "cmd": " ".join(cmd[1:])}
    (out / f"{name}-seed{seed}.seconds").write_text(str(seconds))
    return _result(name, seed, store, seconds, cmd)


def _result(name: str, seed: int, store: Path, seconds: float, cmd: list[str]) -> dict:
    ev = pl.read_parquet(str(store / "round=*" / "evaluation.parquet"), hive_partitioning=True)
    # the math workflows' answer accuracy, else the team's success (any other workflow)
    metric = "accuracy" if ev.filter(pl.col("metric") == "accuracy").height else "success"
    acc = ev.filter(pl.col("metric") == metric).sort("round")["value"].to_list()
    ver = ev.filter(pl.col("metric") == "verdict_balanced_accuracy").sort("round")["value"].to_list()
    steps = 0
    for meta in store.glob("checkpoints/round=*/*/maxit_checkpoint.json"):
        steps += int(json.loads(meta.read_text())["metrics"].get("steps", 0))
    return {"variant": name, "seed": seed, "acc": acc, "verdict": ver, "steps": steps, "seconds": seconds, "cmd": "maxit " + " ".join(cmd[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", default="runs/ablation")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="more flags for every `maxit run` (after --)")
    args = ap.parse_args()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    extra = [a for a in args.extra if a != "--"]
    results = []
    for seed in args.seeds:
        for name in args.variants:
            res = run_variant(name, seed, args.rounds, out, extra)
            results.append(res)
            (out / "results.json").write_text(json.dumps(results, indent=2))
            print(json.dumps({k: v for k, v in res.items() if k != "cmd"}), flush=True)
    print()
    header = "| variant | seed | " + " | ".join(f"r{r}" for r in range(-1, args.rounds)) + " | gain | verdict bal. acc (last) | steps | seconds |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for res in results:
        if "error" in res:
            print(f"| {res['variant']} | {res['seed']} | {res['error']} |")
            continue
        accs = " | ".join(f"{100 * a:.1f}" for a in res["acc"])
        gain = 100 * (res["acc"][-1] - res["acc"][0])
        verdict = f"{100 * res['verdict'][-1]:.1f}" if res["verdict"] else "n/a"
        print(f"| {res['variant']} | {res['seed']} | {accs} | {gain:+.1f} | {verdict} | {res['steps']} | {res['seconds']:.0f} |")
    print("\n| variant | seeds | mean gain | spread (min..max) | mean verdict bal. acc (last) |")
    print("|---|---|---|---|---|")
    for name in args.variants:
        runs = [r for r in results if r["variant"] == name and "error" not in r]
        if not runs:
            continue
        gains = [100 * (r["acc"][-1] - r["acc"][0]) for r in runs]
        ver = [100 * r["verdict"][-1] for r in runs if r["verdict"]]
        mean_ver = f"{sum(ver) / len(ver):.1f}" if ver else "n/a"
        print(f"| {name} | {len(runs)} | {sum(gains) / len(gains):+.1f} | {min(gains):+.1f}..{max(gains):+.1f} | {mean_ver} |")
    print("\nreproduce one row: the `cmd` field of", out / "results.json")


if __name__ == "__main__":
    sys.exit(main())
