"""Round-by-round diagnosis of long runs of the math job, from the stores' own tables.

    .venv/bin/python scripts/long_runs.py rounds --store runs/long-s0
    .venv/bin/python scripts/long_runs.py seeds --store runs/long-s0 runs/long-s1 runs/long-s2
    .venv/bin/python scripts/long_runs.py probe --store runs/long-s0 [--rounds 12 13 17 18]

`rounds`: per round, what the Verifier was shown and trained on (rollouts, training view joined
with the steps for each row's verdict and the correctness of the answer it judged), the
evaluation (with the Verifier's rates on right and on wrong held-out answers recovered from its
plain and balanced accuracy), and the training run (optimizer steps, how far the trained rows'
log-probabilities moved). `seeds`: the key held-out metrics per round, mean and range over stores.
`probe`: the exact held-out answer distributions of each round's checkpoint (every answer 0..198
scored by teacher forcing, under the Solver's and the Verifier's prompts), so that the expected
Solver accuracy and Verifier rates carry no sampling noise, and how often a wrong Solver answer is
the very sum the Verifier works out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import polars as pl  # noqa: E402

SOLVER, VERIFIER = "solver", "verifier"


def _rounds(store: Path) -> list[int]:
    return sorted(int(p.parent.name.split("=")[1]) for p in store.glob("round=*/evaluation.parquet") if p.parent.name != "round=-1")


def evaluation_rows(store: Path) -> pl.DataFrame:
    """Per round (-1 included) the held-out metrics, one column each, plus the Verifier's rate of
    "yes" on right answers (tpr) and of "no" on wrong ones (tnr), solved from plain accuracy v =
    a*tpr + (1-a)*tnr and balanced accuracy b = (tpr + tnr)/2 with a the Solver's accuracy."""
    ev = pl.read_parquet(str(store / "round=*" / "evaluation.parquet"), hive_partitioning=False)
    wide = ev.pivot(on="metric", index="round", values="value", aggregate_function="first").sort("round")
    n = ev.filter(pl.col("metric") == "accuracy").select("round", n=pl.col("n"))
    wide = wide.join(n, on="round").sort("round")
    a, v, b = pl.col("accuracy"), pl.col("verdict_accuracy"), pl.col("verdict_balanced_accuracy")
    # v = a*tpr + (1-a)*(2b - tpr)  ->  tpr = (v - (1-a)*2b) / (2a - 1)
    tpr = (v - (1 - a) * 2 * b) / (2 * a - 1)
    wide = wide.with_columns(tpr=tpr, tnr=2 * b - tpr, n_wrong=((1 - a) * pl.col("n")).round(0).cast(pl.Int64))
    return wide.rename({k: v for k, v in SHORT.items() if k in wide.columns})


SHORT = {
    "accuracy": "s_acc", "accuracy_greedy": "s_greedy", "accuracy_hint": "s_hint", "verdict_accuracy": "v_acc",
    "verdict_balanced_accuracy": "v_bal", "verdict_balanced_accuracy_greedy": "v_bal_greedy", "approve_rate": "approve", "accuracy_approved": "acc_approved",
}


def rollout_rows(store: Path, r: int) -> dict:
    """What the Verifier saw and was trained on in round r."""
    steps = pl.read_parquet(store / f"round={r}" / "steps.parquet").filter(pl.col("active"))
    solver = steps.filter(pl.col("agent_id") == SOLVER).select(parent_node_id=pl.col("step_id"), judged_right=pl.col("local_reward") >= 1)
    ver = steps.filter(pl.col("agent_id") == VERIFIER).join(solver, on="parent_node_id", how="left")
    # the wrong answers like those of the evaluation: first attempts without a hint
    first_wrong = ver.filter(~pl.col("judged_right") & (pl.col("turn") == 0) & pl.col("strategy").is_in(["iid", "tree"]))
    view = pl.read_parquet(store / f"round={r}" / "training_view.parquet")
    vv = view.filter(pl.col("agent_id") == VERIFIER).join(ver.select("step_id", "verdict", "judged_right"), on="step_id", how="left")
    sv = view.filter(pl.col("agent_id") == SOLVER)
    first = steps.filter((pl.col("agent_id") == SOLVER) & (pl.col("strategy") == "iid") & (pl.col("turn") == 0))
    right, wrong = ver.filter(pl.col("judged_right")), ver.filter(~pl.col("judged_right"))
    reg = json.loads(next((store / "checkpoints" / "registry" / f"round={r}").glob("*.json")).read_text())
    diag = pl.read_parquet(store / f"round={r}" / "ratio_diagnostics.parquet").filter((pl.col("agent_id") == "*") & (pl.col("strategy") == "*"))
    yes, no = vv.filter(pl.col("verdict")), vv.filter(~pl.col("verdict"))
    return {
        "round": r,
        "ro_iid": first["local_reward"].mean(),
        "v_calls": ver.height,
        "v_wrong_share": wrong.height / max(ver.height, 1),
        "v_tpr": right["verdict"].mean(),
        "v_tnr": (~wrong["verdict"]).mean() if wrong.height else None,
        "v_first_wrong": first_wrong.height,
        "v_first_tnr": (~first_wrong["verdict"]).mean() if first_wrong.height else None,
        "vw_s": sv.height,
        "vw_yes": yes.height,
        "vw_no": no.height,
        "w_yes": yes["sample_weight"].sum(),
        "w_no": no["sample_weight"].sum(),
        "w_no_row": no["sample_weight"].max() if no.height else None,
        "w_yes_row": yes["sample_weight"].max() if yes.height else None,
        "w_solver": sv["sample_weight"].sum(),
        "opt_steps": int(reg["metrics"]["steps"]),
        "mean_loss": reg["metrics"].get("mean_loss"),
        "log_ratio": diag["mean_log_ratio"][0] if diag.height else None,
    }


def weight_moves(store: Path) -> pl.DataFrame:
    """Per round, how far training moved the weights: ||w_r - w_parent|| / ||w_parent||."""
    from safetensors.numpy import load_file
    import numpy as np

    out = []
    for r in _rounds(store):
        meta = json.loads(next((store / "checkpoints" / "registry" / f"round={r}").glob("*.json")).read_text())
        new, old = (load_file(str(Path(d) / "model.safetensors")) for d in (meta["path"], meta["parent"]))
        diff = np.sqrt(sum(float(((new[k] - old[k]) ** 2).sum()) for k in new))
        norm = np.sqrt(sum(float((old[k] ** 2).sum()) for k in old))
        out.append({"round": r, "weight_move": diff / norm, "optimizer_state": (Path(meta["path"]) / "optimizer.pt").exists()})
    return pl.DataFrame(out)


def rounds_table(store: Path) -> pl.DataFrame:
    ev = evaluation_rows(store)
    ro = pl.DataFrame([rollout_rows(store, r) for r in _rounds(store)]).join(weight_moves(store), on="round")
    return ev.join(ro, on="round", how="left").sort("round")


KEY = ("s_acc", "s_greedy", "v_bal", "tpr", "tnr", "n_wrong")


def seeds_table(stores: list[Path]) -> pl.DataFrame:
    """Per round, each key metric as "mean (min..max)" over the stores (in points; n_wrong: the
    held-out wrong Solver answers the Verifier judged, of 400)."""
    parts = [evaluation_rows(s).select("round", *KEY).with_columns(pl.col(KEY[:-1]) * 100) for s in stores]
    both = pl.concat(parts)
    out = both.group_by("round", maintain_order=True).agg(
        [pl.format("{} ({}..{})", *(getattr(pl.col(k), f)().round(1) for f in ("mean", "min", "max"))).alias(k) for k in KEY]
    )
    return out.sort("round")


def series_table(stores: list[Path], metrics: tuple[str, ...] = ("s_acc", "v_bal")) -> pl.DataFrame:
    """Per round, each metric of each store (points), a column per (metric, store)."""
    out = None
    for m in metrics:
        for s in stores:
            col = evaluation_rows(s).select("round", (pl.col(m) * 100).round(1).alias(f"{m} {s.name}"))
            out = col if out is None else out.join(col, on="round", how="full", coalesce=True)
    return out.sort("round")


def target_table(stores: list[Path], last: int = 5) -> pl.DataFrame:
    """Per store, issue 45's target: the Solver's last-round held-out accuracy within 2 points of
    its best round, and the Verifier's balanced accuracy >= 85% in each of the last `last` rounds."""
    rows = []
    for s in stores:
        ev = evaluation_rows(s).filter(pl.col("round") >= 0)
        acc, bal = ev["s_acc"] * 100, ev["v_bal"] * 100
        best = int(acc.arg_max())
        tail = bal.tail(last)
        rows.append({
            "store": s.name, "rounds": ev.height, "best_acc": acc[best], "best_round": int(ev["round"][best]), "last_acc": acc[-1],
            "gap": acc[best] - acc[-1], "bal_last5_min": tail.min(), "bal_last5_mean": tail.mean(),
            "solver_ok": acc[best] - acc[-1] <= 2, "verifier_ok": tail.min() >= 85,
        })
    return pl.DataFrame(rows)


def regression_rows(stores: list[Path]) -> pl.DataFrame:
    """Per store, what `maxit run` and `maxit report` name (`pipeline.reporting.regression.round_regressions`
    over the store's workflow's table metrics): the last round's warnings and the rounds with any."""
    from pipeline.reporting.regression import round_regressions
    from pipeline.reporting.report import table_metrics_of

    out = []
    for s in stores:
        ev = pl.read_parquet(str(s / "round=*" / "evaluation.parquet"), hive_partitioning=False)
        named = round_regressions(ev, table_metrics_of(s)[0])
        last = int(ev["round"].max())
        out.append({
            "store": s.name,
            "last round": named.get(last, "none"),
            "rounds with a warning": ", ".join(str(r) for r in named) or "none",
        })
    return pl.DataFrame(out)


def markdown(table: pl.DataFrame) -> str:
    cols = table.columns
    fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in table.iter_rows()]
    return "\n".join(lines)


# -- the exact probe ---------------------------------------------------------------------------


def answer_distributions(model_dir: Path, prompts: list[list[dict]], answers: list[int], chunk: int = 4096) -> "numpy.ndarray":
    """(prompts, answers) probability of each answer's tokens + EOS after each prompt, by
    teacher forcing every (prompt, answer) pair (right-padded: the padding comes after the tokens
    scored, which a causal model never attends to)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.models import load_tokenizer
    from pipeline.models.chat import encode_prompt

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    eos = tok.eos_token_id
    comps = [tok(str(a), add_special_tokens=False)["input_ids"] + [eos] for a in answers]
    pairs = [(encode_prompt(tok, m), c) for m in prompts for c in comps]
    out = np.zeros(len(pairs))
    with torch.no_grad():
        for start in range(0, len(pairs), chunk):
            part = pairs[start : start + chunk]
            width = max(len(p) + len(c) for p, c in part)
            ids = torch.full((len(part), width), eos, dtype=torch.long)
            rows, pos, tgt = [], [], []
            for j, (p, c) in enumerate(part):
                ids[j, : len(p) + len(c)] = torch.tensor(p + c)
                rows += [j] * len(c)
                pos += range(len(p) - 1, len(p) - 1 + len(c))
                tgt += c
            logp = model(ids).logits.log_softmax(-1)[torch.tensor(rows), torch.tensor(pos), torch.tensor(tgt)]
            out[start : start + len(part)] = np.bincount(np.array(rows), weights=logp.double().numpy(), minlength=len(part))
    return np.exp(out).reshape(len(prompts), len(answers))


def probe(store: Path, rounds: list[int] | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per checkpoint, the expected held-out metrics from exact answer distributions; and per
    (checkpoint, problem) the Solver's and the Verifier's chance of the right answer, their likelier
    answers, and the chance that the Verifier's sum is the very wrong answer the Solver gave."""
    import numpy as np

    from pipeline.config import EvalConfig
    from pipeline.tasks import build_task

    task = build_task("arithmetic", None, None)
    problems = task.problems("heldout", EvalConfig.problems, EvalConfig.seed)  # the evaluation's problems
    answers = list(range(0, 199))
    truth = np.array([answers.index(int(p.answer)) for p in problems])
    s_prompts = [task.solver_messages(p) for p in problems]
    v_prompts = [task.verifier_messages(p, "") for p in problems]
    rows, per = [], []
    base = json.loads((store / "checkpoints" / "registry" / "round=-1" / "shared.json").read_text())["path"]
    for r in rounds if rounds is not None else [-1, *_rounds(store)]:
        model_dir = Path(base) if r == -1 else store / "checkpoints" / f"round={r}" / "shared"
        ps = answer_distributions(model_dir, s_prompts, answers)
        pv = answer_distributions(model_dir, v_prompts, answers)
        idx = np.arange(len(problems))
        s_right, v_right = ps[idx, truth], pv[idx, truth]
        s_wrong = ps.copy()
        s_wrong[idx, truth] = 0
        same = (s_wrong * pv).sum(1)  # a wrong answer k is approved when the Verifier's sum is k too
        rows.append({
            "round": r,
            "solver_acc": s_right.mean(),
            "solver_mass": ps.sum(1).mean(),
            "verifier_sum_acc": v_right.mean(),
            "tpr": (s_right * v_right).sum() / s_right.sum(),
            "tnr": 1 - same.sum() / s_wrong.sum(),
            "p_wrong": s_wrong.sum(1).mean(),
            "greedy_wrong": float(np.mean(ps.argmax(1) != truth)),
            "greedy_same_wrong": float(np.mean((ps.argmax(1) != truth) & (ps.argmax(1) == pv.argmax(1)))),
        })
        per.append(pl.DataFrame({
            "round": r, "question": [p.question for p in problems], "answer": [int(p.answer) for p in problems],
            "s_right": s_right, "v_right": v_right, "s_wrong": s_wrong.sum(1), "v_same_wrong": same,
            "s_top": ps.argmax(1), "v_top": pv.argmax(1),
        }))
    out = pl.DataFrame(rows)
    return out.with_columns(balanced=(pl.col("tpr") + pl.col("tnr")) / 2), pl.concat(per)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("rounds", "seeds", "series", "target", "warnings", "probe"))
    ap.add_argument("--store", nargs="+", required=True, type=Path)
    ap.add_argument("--rounds", nargs="*", type=int, default=None)
    ap.add_argument("--csv", type=Path, default=None, help="also write the table here")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = ap.parse_args()
    pl.Config.set_tbl_rows(200)
    pl.Config.set_tbl_cols(40)
    pl.Config.set_float_precision(3)
    pl.Config.set_tbl_width_chars(250)
    if args.what == "seeds":
        table = seeds_table(args.store)
    elif args.what == "series":
        table = series_table(args.store)
    elif args.what == "warnings":
        table = regression_rows(args.store)
    elif args.what == "target":
        table = target_table(args.store)
    elif args.what == "rounds":
        table = rounds_table(args.store[0])
    else:
        table, per_problem = probe(args.store[0], args.rounds)
        if args.csv:
            per_problem.write_csv(args.csv.with_suffix(".problems.csv"))
    print(markdown(table) if args.markdown else table)
    if args.csv:
        table.write_csv(args.csv)


if __name__ == "__main__":
    main()
