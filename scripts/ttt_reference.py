"""Reference win rates against tic-tac-toe's scripted player on the evaluation's held-out positions:
an optimal player (a random best move), a random legal player, and mixtures, in each seat.

    .venv/bin/python scripts/ttt_reference.py [--problems 200] [--samples 2]

They bound what `maxit run --workflow tic_tac_toe` can reach on its `win_vs_scripted` metric
(docs/results/games.md)."""

from __future__ import annotations

import argparse
import random

from pipeline.config import EvalConfig
from pipeline.workflows.games.env import SPECS, GameEnv
from pipeline.workflows.games.opponents import random_legal, ttt_heuristic
from pipeline.workflows.games.positions import replay
from pipeline.workflows.games.spiel import best_moves
from pipeline.workflows.games.workflow import TicTacToeWorkflow


def play(policy, seat: int, history: str, seed: str) -> float:
    env = GameEnv(SPECS["tic_tac_toe"], replay(SPECS["tic_tac_toe"], history, seed), {"me": seat}, -1.0, opponent=ttt_heuristic, judge=seat, seed=seed)
    rng = random.Random(seed)
    while not env.over:  # the environment's own step: the move, then the scripted player's reply
        env.step("me", str(policy(env.table, rng)))
    return env.result(seat)


def mixture(p_best: float):
    return lambda table, rng: rng.choice(best_moves(table)) if rng.random() < p_best else random_legal(table, rng)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=EvalConfig().problems)
    ap.add_argument("--samples", type=int, default=EvalConfig().samples)
    args = ap.parse_args()
    problems = TicTacToeWorkflow().problems("heldout", args.problems, EvalConfig().seed)
    print(f"| player (share of best moves) | win as x | win as o | win, both seats | draw, both seats |\n|---|---:|---:|---:|---:|")
    for p in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0):
        seats = [[play(mixture(p), seat, pr.question, f"{pr.uid}:{k}") for pr in problems for k in range(args.samples)] for seat in (0, 1)]
        both = seats[0] + seats[1]
        win = lambda r: 100 * sum(x == 1.0 for x in r) / len(r)  # noqa: E731
        print(f"| {p:.2f} | {win(seats[0]):.1f} | {win(seats[1]):.1f} | {win(both):.1f} | {100 * sum(x == 0.5 for x in both) / len(both):.1f} |")


if __name__ == "__main__":
    main()
