"""How well tic-tac-toe models choose at the positions that decide games: over every reachable
position with the mover to play, and over the critical ones (where some legal move is worse than
the best), the share where the model's most likely cell is a best move (greedy) and the
probability it puts on the best moves (what sampling at T=1 plays).

    .venv/bin/python scripts/ttt_critical.py MODEL_DIR [MODEL_DIR ...]
    .venv/bin/python scripts/ttt_critical.py --sft-steps 1500 [--lr 1e-3]
    .venv/bin/python scripts/ttt_critical.py --mlp-steps 1500
    .venv/bin/python scripts/ttt_critical.py --versus MODEL_DIR [MODEL_DIR ...]

MODEL_DIR: the embedded model (`ttt_model()`) or a round's checkpoint (`STORE/checkpoints/
round=R/shared`). `--sft-steps N` instead trains a fresh model of the embedded model's shape and tokenizer on best
moves only (the warm start's clean targets, `ttt_sft_examples` with noise 0) for N steps and
prints the same figures every 100 steps: what supervised learning on the right answers reaches,
an upper bound on what self-play's training on sampled best moves teaches (docs/results/games.md).
`--mlp-steps N` trains a reference learner on the same examples (train-split positions of random
games, one best move each, batch 64, Adam at `--lr`): a two-layer MLP whose inputs are the nine
cells one-hot and the mover, so the board's geometry is given rather than read from characters.
`--versus` adds, per model, its exact expected results against the scripted player on the
evaluation's held-out positions in both seats (the evaluation samples them; here every branch is
weighed by its probability, so there is no sampling noise): playing at T=1 (the evaluation's
temperature; probability on a taken cell forfeits), greedy, and renormalized onto best moves (what
its choice among best moves alone would win), then where its T=1 play leaves best moves, by kind of
position, weighted by how often play against the scripted player reaches it."""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from pipeline.workflows.games.env import SPECS, prompt_text
from pipeline.workflows.games.opponents import ttt_forced
from pipeline.workflows.games.positions import replay
from pipeline.workflows.games.spiel import Table, best_moves

SPEC = SPECS["tic_tac_toe"]


def positions() -> list[tuple[str, list[int], list[int]]]:
    """(prompt, legal cells, best cells) of every reachable position with a move to make."""
    out, seen = [], set()

    def walk(table: Table) -> None:
        key = str(table.state)
        if table.done or key in seen:
            return
        seen.add(key)
        out.append((prompt_text(SPEC, table, table.agent_selection), table.legal(), best_moves(table)))
        for a in table.legal():
            child = table.clone()
            child.step(a)
            walk(child)

    walk(Table(SPEC.name, 0))
    return out


def cell_probs(model, tokenizer, prompts: list[str]):
    """(len(prompts), 9): the probability of each cell's number as the first token of the answer."""
    import torch

    digits = [tokenizer.convert_tokens_to_ids(str(i)) for i in range(9)]
    was_training = model.training
    model.eval()
    probs = []
    with torch.no_grad():
        for k in range(0, len(prompts), 256):
            chunk = prompts[k:k + 256]
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            mask = enc["attention_mask"]
            last = mask.sum(1) - 1 if tokenizer.padding_side == "right" else torch.full((len(chunk),), mask.shape[1] - 1)
            probs.append(torch.softmax(model(**enc).logits[torch.arange(len(chunk)), last].float(), -1)[:, digits])
    model.train(was_training)
    return torch.cat(probs)


def measure(model, tokenizer, items) -> dict[str, float]:
    """Greedy best-move share and mass on best moves, over all `items` and the critical ones."""
    return scores(items, cell_probs(model, tokenizer, [p for p, *_ in items]))


def scores(items, probs) -> dict[str, float]:
    """Greedy best-move share and mass on best moves of `probs` (one row of the nine cells' probabilities
    per item), over all items and the critical ones."""
    import torch

    sums = {"all": [0, 0.0, 0], "critical": [0, 0.0, 0]}
    for (_, legal, best), p in zip(items, probs):
        hit, mass = int(torch.argmax(p)) in best, float(p[best].sum())
        for name in ["all"] + ["critical"] * (len(best) < len(legal)):
            sums[name][0] += hit
            sums[name][1] += mass
            sums[name][2] += 1
    return {f"{name} {what}": (s[i] / s[2]) for name, s in sums.items() for i, what in ((0, "greedy"), (1, "mass"))}


def line(label: str, m: dict[str, float]) -> str:
    keys = ("all greedy", "all mass", "critical greedy", "critical mass")
    return f"| {label} | " + " | ".join(f"{100 * m[k]:.1f}" for k in keys) + " |"


def sft_curve(items, steps: int, lr: float) -> None:
    import torch

    from pipeline.models.build import untrained_model
    from pipeline.models.sft import sft_steps, warmup_cosine
    from pipeline.workflows.games.model import TTTWarmStartConfig, ttt_model_config, ttt_sft_examples, ttt_tokenizer

    config = TTTWarmStartConfig(steps=steps, clean_steps=steps, lr=lr, lr_final=lr / 2, noise=0.0)
    model_config = ttt_model_config(config.seed)
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    tokenizer, model = untrained_model(model_config, ttt_tokenizer(model_config.max_position_embeddings), tempfile.mkdtemp())
    rng = random.Random(f"ttt-critical-sft:{config.seed}")

    for step, _loss in sft_steps(model, tokenizer, lambda _s: ttt_sft_examples(rng, config.batch_size, config),
                                 steps=steps, lr=lr, lr_lambda=warmup_cosine(config.warmup_steps, steps, config.lr_final / lr)):
        if step % 100 == 0 or step == steps:
            print(line(f"SFT on best moves, step {step} (lr {lr:g})", measure(model, tokenizer, items)), flush=True)


def cell_features(prompt: str) -> list[float]:
    """The nine cells of a prompt's board one-hot (x, o, free) and whether x moves: 28 inputs."""
    lines = prompt.split("\n")
    cells = lines[1].removeprefix("cells: ").split() if len(lines) > 1 else []
    if [c[1:] for c in cells] != [str(i) for i in range(9)] or any(c[0] not in "xo." for c in cells):
        raise ValueError(f"not a tic-tac-toe board: {prompt!r}")
    return [float(c[0] == k) for c in cells for k in "xo."] + [float(lines[0].split()[1] == "x")]


def mlp_curve(items, steps: int, lr: float) -> None:
    import torch

    from pipeline.workflows.games.model import TTTWarmStartConfig, ttt_sft_examples

    config = TTTWarmStartConfig(noise=0.0)
    torch.manual_seed(config.seed)
    net = torch.nn.Sequential(torch.nn.Linear(28, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 9))
    opt = torch.optim.Adam(net.parameters(), lr)
    rng = random.Random(f"ttt-critical-sft:{config.seed}")
    every = torch.tensor([cell_features(p) for p, *_ in items])
    for step in range(1, steps + 1):
        batch = ttt_sft_examples(rng, config.batch_size, config)
        x = torch.tensor([cell_features(msgs[0]["content"]) for msgs, _ in batch])
        loss = torch.nn.functional.cross_entropy(net(x), torch.tensor([int(t) for _, t in batch]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps:
            with torch.no_grad():
                probs = torch.softmax(net(every), -1)
            print(line(f"MLP on the cells, same examples, step {step} (lr {lr:g})", scores(items, probs)), flush=True)


def heldout_starts() -> list[Table]:
    """The evaluation's held-out positions (the tic-tac-toe workflow's, at the evaluation's seed)."""
    from pipeline.config import EvalConfig
    from pipeline.workflows.games.workflow import TicTacToeWorkflow

    return [replay(SPEC, p.question, seed="versus") for p in TicTacToeWorkflow().problems("heldout", EvalConfig().problems, EvalConfig().seed)]


def versus(policy, starts: list[Table]) -> dict[str, float]:
    """Exact expected results of `policy` (prompt, legal cells, best cells -> {cell: probability}
    over the nine cells; mass on a taken cell forfeits) against the scripted player (`ttt_forced`,
    else a uniformly random free cell) from each of `starts`, in each seat: "win"/"draw" over both
    seats, "win x"/"win o", and, per kind of position the policy moves at ("win available", "must
    block", "quiet"), "visits <kind>" (per game) and "off best <kind>" (probability off best moves
    per visit)."""
    out = {"win": 0.0, "draw": 0.0, "win x": 0.0, "win o": 0.0}
    visits: dict[str, float] = {}
    off: dict[str, float] = {}
    for seat in (0, 1):

        def value(table: Table, reach: float) -> tuple[float, float]:
            if table.done:
                r = table.rewards()[seat]
                return (1.0, 0.0) if r > 0 else (0.0, 1.0) if r == 0 else (0.0, 0.0)
            legal = table.legal()
            if table.agent_selection == seat:
                best = best_moves(table)
                forced = ttt_forced(table)
                kind = "quiet" if forced is None else "win available" if forced[1] == "win" else "must block"
                dist = policy(prompt_text(SPEC, table, seat), legal, best)
                visits[kind] = visits.get(kind, 0.0) + reach
                off[kind] = off.get(kind, 0.0) + reach * (1.0 - sum(dist.get(c, 0.0) for c in best))
                dist = {c: p for c, p in dist.items() if c in legal}  # the rest forfeits: no win, no draw
            else:
                forced = ttt_forced(table)
                dist = {forced[0]: 1.0} if forced is not None else {c: 1.0 / len(legal) for c in legal}
            win = draw = 0.0
            for cell, p in dist.items():
                if p > 0:
                    child = table.clone()
                    child.step(cell)
                    w, d = value(child, reach * p)
                    win, draw = win + p * w, draw + p * d
            return win, draw

        for table in starts:
            w, d = value(table, 1.0 / (2 * len(starts)))
            out["win"] += w / (2 * len(starts))
            out["draw"] += d / (2 * len(starts))
            out["win " + "xo"[seat]] += w / len(starts)
    for kind in visits:
        out[f"visits {kind}"] = visits[kind]
        out[f"off best {kind}"] = off[kind] / visits[kind]
    return out


def versus_lines(label: str, probs: dict[str, list[float]], starts: list[Table]) -> list[str]:
    """The `--versus` table rows of one model (`probs`: prompt -> the nine cells' probabilities)."""
    plays = {
        "T=1": lambda prompt, legal, best: dict(enumerate(probs[prompt])),
        "greedy": lambda prompt, legal, best: {max(range(9), key=lambda c: probs[prompt][c]): 1.0},
        "onto best": lambda prompt, legal, best: {c: probs[prompt][c] / (sum(probs[prompt][b] for b in best) or 1.0) for c in best},
    }
    rows, kinds = [], None
    for name, policy in plays.items():
        m = versus(policy, starts)
        rows.append(f"| {label}, {name} | {100 * m['win']:.1f} | {100 * m['win x']:.1f} | {100 * m['win o']:.1f} | {100 * m['draw']:.1f} |")
        kinds = kinds or m
    rows.append("|  | " + "; ".join(f"{k}: {kinds['visits ' + k]:.2f} a game, {100 * kinds['off best ' + k]:.1f}% off best at T=1"
                                     for k in ("win available", "must block", "quiet") if "visits " + k in kinds) + " | | | |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="model or checkpoint folders")
    ap.add_argument("--sft-steps", type=int, default=0, help="train a fresh model on best moves for this many steps instead")
    ap.add_argument("--mlp-steps", type=int, default=0, help="train the reference MLP on the same examples for this many steps")
    ap.add_argument("--versus", action="store_true", help="also each model's exact expected results against the scripted player on the held-out positions")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of --sft-steps and the rate of --mlp-steps (default 1e-3, the warm start's)")
    args = ap.parse_args()
    if not args.models and not args.sft_steps and not args.mlp_steps:
        ap.error("give model folders, --sft-steps N or --mlp-steps N")
    if args.versus and not args.models:
        ap.error("--versus plays model folders: give at least one")
    for folder in args.models:
        if not (Path(folder) / "config.json").is_file():
            ap.error(f"{folder}: not a model folder (no config.json)")
    if args.sft_steps < 0 or args.mlp_steps < 0 or args.lr <= 0:
        ap.error("--sft-steps and --mlp-steps must be >= 0 and --lr > 0")
    items = positions()
    n_crit = sum(len(b) < len(l) for _, l, b in items)
    print(f"{len(items)} positions with a move to make, {n_crit} critical (some legal move is worse than the best)")
    print("| model | greedy best, all | mass on best, all | greedy best, critical | mass on best, critical |\n|---|---:|---:|---:|---:|")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    found = {}
    for folder in args.models:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        probs = cell_probs(AutoModelForCausalLM.from_pretrained(folder), tokenizer, [p for p, *_ in items])
        print(line(folder, scores(items, probs)), flush=True)
        found[folder] = {p: row.tolist() for (p, *_), row in zip(items, probs)}
    if args.versus and found:
        starts = heldout_starts()
        print(f"\nExact expected results against the scripted player, {len(starts)} held-out positions x 2 seats")
        print("| model, play | win, both seats | win as x | win as o | draw, both seats |\n|---|---:|---:|---:|---:|")
        for folder, probs in found.items():
            print("\n".join(versus_lines(folder, probs, starts)), flush=True)
    if args.sft_steps:
        sft_curve(items, args.sft_steps, args.lr)
    if args.mlp_steps:
        mlp_curve(items, args.mlp_steps, args.lr)


if __name__ == "__main__":
    main()
