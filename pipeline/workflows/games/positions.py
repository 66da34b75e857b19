"""The games' problems: a dealt instance and an opening. Every distinct position a problem can
start at (`positions`), the class of a position up to the board's mirror images
(`position_class`), the train / held-out split of the starts (`position_splits`), the histories a
round draws (`draw_histories`), and the table a history replays to (`replay`).
"""

from __future__ import annotations

import random
from functools import lru_cache

from pipeline.errors import ConfigError
from pipeline.tasks.base import split_of
from pipeline.workflows.games.env import GameSpec
from pipeline.workflows.games.spiel import Table

__all__ = ["replay", "positions", "position_class", "continuations", "position_splits", "draw_histories"]


def replay(spec: GameSpec, history: str, seed: str) -> Table:
    """The table after `history` (comma-separated actions from the initial state, chance outcomes
    included); later chance outcomes come from `seed`."""
    from pipeline.workflows.games.spiel import load_game

    state = load_game(spec.name).new_initial_state()
    for a in [int(x) for x in history.split(",") if x]:
        state.apply_action(a)
    return Table(spec.name, seed, state)


@lru_cache(maxsize=None)
def positions(spec: GameSpec, opening: int) -> tuple[tuple[str, str], ...]:
    """(position key, history) of every distinct position a problem can start at: each outcome of
    the game's opening chance nodes (the deal), followed by 0, 2, ... `opening` legal plies, not
    finished; the key is the position itself (OpenSpiel's text of the state), so two move orders
    reaching one board are one problem. Sorted by key."""
    from pipeline.workflows.games.spiel import load_game

    found: dict[str, str] = {}
    frontier = [load_game(spec.name).new_initial_state()]
    while frontier and frontier[0].is_chance_node():
        frontier = [_child(s, a) for s in frontier for a, _ in s.chance_outcomes()]
    for plies in range(opening + 1):
        if plies % 2 == 0:
            for state in frontier:
                found.setdefault(str(state), ",".join(map(str, state.history())))
        if plies < opening:
            frontier = list({str(c): c for s in frontier for a in s.legal_actions() if not (c := _child(s, a)).is_terminal()}.values())
    return tuple(sorted(found.items()))


def _child(state, action: int):
    child = state.clone()
    child.apply_action(action)
    return child


def _square_symmetries(side: int) -> tuple[tuple[int, ...], ...]:
    """The 8 rotations and reflections of a `side` x `side` board, each as the cell every cell goes to."""
    rotate = lambda i: (i % side) * side + (side - 1 - i // side)  # noqa: E731
    reflect = lambda i: (i // side) * side + (side - 1 - i % side)  # noqa: E731
    out, cells = [], list(range(side * side))
    for _ in range(4):
        out += [tuple(cells), tuple(reflect(i) for i in cells)]
        cells = [rotate(i) for i in cells]
    return tuple(out)


def position_class(spec: GameSpec, key: str) -> str:
    """The problem a position key (`positions`) is: on a square board (`GameSpec.square_board`),
    the least of its rotations and reflections, so a position and its mirror images are one;
    elsewhere the key itself."""
    side = spec.square_board
    cells = key.replace("\n", "")
    if not side or len(cells) != side * side:
        return key
    images = []
    for moved in _square_symmetries(side):
        board = [""] * len(cells)
        for i, c in enumerate(cells):
            board[moved[i]] = c
        images.append("".join(board))
    return min(images)


def continuations(spec: GameSpec, history: str, plies: int) -> set[str]:
    """The keys of the unfinished positions reached from `history` in 1 .. `plies` more plies."""
    state, found = replay(spec, history, seed="").state, set()
    frontier = [state]
    for _ in range(plies):
        frontier = [c for s in frontier for a in s.legal_actions() if not (c := _child(s, a)).is_terminal()]
        found |= {str(c) for c in frontier}
    return found


@lru_cache(maxsize=None)
def position_splits(spec: GameSpec, opening: int, heldout_fraction: float) -> dict[str, str]:
    """The split of every problem position (`positions`): position key -> "train" | "heldout";
    a position in neither split is left out.

    The rule, so that nothing trained on is a held-out problem or leads to one:
    - held-out problems are positions of the deepest opening level (`opening` plies; every
      problem a held-out game starts at), whose class (`position_class`: the position up to the
      board's mirror images) a hash puts on the held-out side;
    - the other classes of that level are train problems: one level's positions never reach each
      other, so a training game, which only ever moves forward, never passes a held-out start;
    - a shallower position is a train problem only when none of its continuations within the
      opening is held out (a game from it could reach a held-out start), else it is in neither
      split. (In tic-tac-toe nearly every shallower position leads to some held-out start.)
    No held-out start is therefore reachable from a train start, and none is a position before
    one. A held-out game's later positions may be met in training: two openings share their
    continuations, so no split of starts can keep them apart."""
    found = positions(spec, opening)
    if not found:
        return {}
    depth = {key: _plies(spec, history) for key, history in found}
    deepest = max(depth.values())
    out = {key: split_of(position_class(spec, key), heldout_fraction, salt=f"{spec.name}:") for key, d in depth.items() if d == deepest}
    held = {key for key, split in out.items() if split == "heldout"}
    for key, history in found:
        if depth[key] < deepest and not continuations(spec, history, deepest - depth[key]) & held:
            out[key] = "train"
    return out


def _plies(spec: GameSpec, history: str) -> int:
    """Players' moves in `history` (the deal's chance outcomes not counted)."""
    from pipeline.workflows.games.spiel import load_game

    state, plies = load_game(spec.name).new_initial_state(), 0
    for a in [int(x) for x in history.split(",") if x]:
        plies += not state.is_chance_node()
        state.apply_action(a)
    return plies


def draw_histories(spec: GameSpec, split: str, n: int, seed: int, opening: int, heldout_fraction: float) -> list[str]:
    """`n` problem histories of `split` at distinct positions (`positions`), in an order drawn from
    `seed`. A position's split is `position_splits`' (train and held-out never share one, nor
    does a train position lead to a held-out one); asking for more than the split holds is a
    `ConfigError` saying how many it holds."""
    splits = position_splits(spec, opening, heldout_fraction)
    pool = [h for key, h in positions(spec, opening) if splits.get(key) == split]
    if n > len(pool):
        raise ConfigError(f"{spec.name}: {split} has {len(pool)} positions with openings of up to {opening} plies, {n} asked for (ask for fewer: --problems for train, --eval-problems for heldout; or change opening or heldout_fraction)")
    random.Random(f"{spec.name}:{split}:{seed}").shuffle(pool)
    return pool[:n]
