"""The games' scripted opponents (`OPPONENTS`): a uniformly random legal move, and tic-tac-toe's
heuristic player, which wins or blocks a line where it can (`ttt_forced`).
"""

from __future__ import annotations

import random
from typing import Callable

from pipeline.workflows.games.spiel import Table

__all__ = ["OPPONENTS", "random_legal", "ttt_forced", "ttt_heuristic"]


def random_legal(table: Table, rng: random.Random) -> int:
    """A uniformly random legal action."""
    return rng.choice(table.legal())


_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def ttt_forced(table: Table) -> tuple[int, str] | None:
    """The cell tic-tac-toe's mover must play and why: (cell, "win") where a line of its own
    lacks one cell, else (cell, "block") where the other's does; None when neither."""
    me = table.agent_selection
    cells = table.observation(me).replace("\n", "")
    mine, theirs = ("x", "o") if me == 0 else ("o", "x")
    legal = table.legal()
    for mark, why in ((mine, "win"), (theirs, "block")):
        for line in _LINES:
            marks = [cells[i] for i in line]
            if marks.count(mark) == 2 and marks.count(".") == 1:
                cell = line[marks.index(".")]
                if cell in legal:
                    return cell, why
    return None


def ttt_heuristic(table: Table, rng: random.Random) -> int:
    """Tic-tac-toe's scripted player: complete its own line if it can, else block the other's
    (`ttt_forced`), else a random legal cell."""
    forced = ttt_forced(table)
    return forced[0] if forced is not None else rng.choice(table.legal())


OPPONENTS: dict[str, dict[str, Callable[[Table, random.Random], int]]] = {
    "tic_tac_toe": {"heuristic": ttt_heuristic, "random": random_legal},
    "bargaining": {"random": random_legal},
}
"""Scripted players per game (the first is the evaluation's default)."""
