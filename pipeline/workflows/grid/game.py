"""The grid game: puzzles, what each agent sees, rewards, and the environment of one episode
(`GridEnv`). `pipeline.workflows.grid` is the workflow on it; the embedded model's build
(`pipeline.workflows.grid.model`) warm-starts on it.

The game. A puzzle is a small grid (4 x 4 by default) of free cells ".", walls "#", the goal "G"
and the team's position "A", rendered as text rows. Each turn the planner proposes the next move
(one letter U, D, L or R) and the mover, shown the grid and the proposal, commits one move; a move
into a wall or off the grid leaves the position where it is. The episode ends at the goal or after
the puzzle's turn cap: the shortest path's length + `slack` (or `max_loop_num` turns when given).

What each agent sees (one user message, a few dozen characters; the embedded model's context is
256 tokens):
- planner: "plan\\n" + the grid with "A" at the current position;
- mover:   "move X\\n" + the same grid, X the planner's proposal ("?" when it wrote no move).

Rewards: each call's local reward is 1.0 when its move is optimal (it lies on a shortest path
from the current position: the BFS distance to the goal drops by one), else 0.0 (a wrong move, a
wall, or text that is not one move letter); the team reward is 1.0 when the team stands on the
goal, else 0.0.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from pipeline.errors import DataError
from pipeline.tasks.base import draw_distinct, split_of
from pipeline.types import Message
from pipeline.rollout.contract import Env, StepResult, jsonl_objects

__all__ = [
    "GridEnv",
    "Puzzle",
    "parse_puzzle",
    "generate_puzzles",
    "read_puzzle_file",
    "planner_text",
    "mover_text",
    "read_move",
    "MOVES",
    "PLANNER",
    "MOVER",
]

PLANNER = "planner"
MOVER = "mover"
MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
"""Move letter -> (row, column) step."""
WALL, FREE, GOAL, AGENT = "#", ".", "G", "A"
START_MARKS = (AGENT, "S")
"""A puzzle's start is written "A" (as the agents see it) or "S"."""
MAX_CELLS = 100
"""Largest puzzle (rows x columns): the prompts must fit the embedded model's 256 positions."""
NO_PLAN = "?"
"""What the mover is shown when the planner wrote no move letter."""
PLANNER_PREFIX = "plan\n"
MOVER_PREFIX = "move "


# -- puzzles --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Puzzle:
    """One maze: its cells (walls, free, goal; the start is free), the start and the goal, and the
    BFS distance of every cell to the goal (None: unreachable or a wall)."""

    rows: tuple[str, ...]
    """The grid without the start mark: ".", "#" and one "G"."""
    start: tuple[int, int]
    goal: tuple[int, int]
    dist: tuple[tuple[int | None, ...], ...] = field(repr=False, compare=False, default=())

    @property
    def height(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return len(self.rows[0])

    @property
    def text(self) -> str:
        """The puzzle as `Problem.question`: the grid with "A" at the start."""
        return render(self, self.start)

    @property
    def shortest(self) -> int:
        """Moves on a shortest path from the start to the goal."""
        return self.dist[self.start[0]][self.start[1]]

    def free(self, cell: tuple[int, int]) -> bool:
        r, c = cell
        return 0 <= r < self.height and 0 <= c < self.width and self.rows[r][c] != WALL

    def optimal_moves(self, pos: tuple[int, int]) -> tuple[str, ...]:
        """The moves from `pos` that lie on a shortest path to the goal (none at the goal)."""
        d = self.dist[pos[0]][pos[1]]
        if d is None or d == 0:
            return ()
        out = []
        for letter, (dr, dc) in MOVES.items():
            nr, nc = pos[0] + dr, pos[1] + dc
            if self.free((nr, nc)) and self.dist[nr][nc] == d - 1:
                out.append(letter)
        return tuple(out)

    def after(self, pos: tuple[int, int], move: str | None) -> tuple[int, int]:
        """The position after `move` (unchanged for no move, a wall or the grid's edge)."""
        if move not in MOVES:
            return pos
        dr, dc = MOVES[move]
        nxt = (pos[0] + dr, pos[1] + dc)
        return nxt if self.free(nxt) else pos

    def path(self) -> str:
        """One shortest path from the start as move letters (the first optimal move in U, D, L, R
        order at every cell)."""
        pos, out = self.start, []
        while pos != self.goal:
            move = self.optimal_moves(pos)[0]
            out.append(move)
            pos = self.after(pos, move)
        return "".join(out)

    def hint(self) -> str:
        """The grid (no "A") with the move to take written on every cell of `path()`."""
        cells = [list(row) for row in self.rows]
        pos = self.start
        for move in self.path():
            cells[pos[0]][pos[1]] = move
            pos = self.after(pos, move)
        return "\n".join("".join(row) for row in cells)


def render(puzzle: Puzzle, pos: tuple[int, int]) -> str:
    """The grid as text rows with "A" at `pos`."""
    rows = [list(row) for row in puzzle.rows]
    rows[pos[0]][pos[1]] = AGENT
    return "\n".join("".join(row) for row in rows)


def _distances(rows: Sequence[str], goal: tuple[int, int]) -> tuple[tuple[int | None, ...], ...]:
    h, w = len(rows), len(rows[0])
    dist: list[list[int | None]] = [[None] * w for _ in range(h)]
    dist[goal[0]][goal[1]] = 0
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < h and 0 <= nc < w and rows[nr][nc] != WALL and dist[nr][nc] is None:
                dist[nr][nc] = dist[r][c] + 1
                queue.append((nr, nc))
    return tuple(tuple(row) for row in dist)


@lru_cache(maxsize=65536)
def parse_puzzle(text: str) -> Puzzle:
    """A puzzle from its text rows (newlines or "/" between rows; "." free, "#" wall, "A" or "S"
    the start, "G" the goal). Anything else (ragged rows, another character, no or two starts or
    goals, a goal the start cannot reach, more than `MAX_CELLS` cells) is a ValueError saying what."""
    if not isinstance(text, str):
        raise ValueError(f"a grid must be text rows, got {type(text).__name__}")
    rows = [r.strip() for r in text.strip().replace("/", "\n").splitlines() if r.strip()]
    if not rows:
        raise ValueError("the grid is empty")
    widths = sorted({len(r) for r in rows})
    if len(widths) != 1:
        raise ValueError(f"the grid's rows differ in length ({widths})")
    if len(rows) * widths[0] > MAX_CELLS:
        raise ValueError(f"the grid has {len(rows) * widths[0]} cells; at most {MAX_CELLS} fit the prompt")
    allowed = {WALL, FREE, GOAL, *START_MARKS}
    bad = sorted({ch for r in rows for ch in r} - allowed)
    if bad:
        raise ValueError(f"the grid holds {bad}; its cells are '.' (free), '#' (wall), 'A' or 'S' (start), 'G' (goal)")
    starts = [(i, j) for i, r in enumerate(rows) for j, ch in enumerate(r) if ch in START_MARKS]
    goals = [(i, j) for i, r in enumerate(rows) for j, ch in enumerate(r) if ch == GOAL]
    if len(starts) != 1:
        raise ValueError(f"the grid needs exactly one start ('A' or 'S'), it has {len(starts)}")
    if len(goals) != 1:
        raise ValueError(f"the grid needs exactly one goal ('G'), it has {len(goals)}")
    cells = tuple(r.replace(AGENT, FREE).replace("S", FREE) for r in rows)
    dist = _distances(cells, goals[0])
    start = starts[0]
    if dist[start[0]][start[1]] is None:
        raise ValueError("the goal cannot be reached from the start")
    return Puzzle(cells, start, goals[0], dist)


def puzzle_uid(puzzle: Puzzle) -> str:
    return "grid:" + hashlib.blake2b(puzzle.text.encode(), digest_size=6).hexdigest()


def puzzle_split(puzzle: Puzzle, heldout_fraction: float) -> str:
    """"train" or "heldout" by a hash of the puzzle's text alone."""
    return split_of(puzzle.text, heldout_fraction, salt="grid:")


def random_puzzle(rng: random.Random, size: int, walls: int) -> Puzzle | None:
    """A random size x size puzzle with `walls` walls, or None when its goal is unreachable."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    picked = rng.sample(cells, walls + 2)
    wall_cells, start, goal = set(picked[:walls]), picked[walls], picked[walls + 1]
    rows = ["".join(WALL if (r, c) in wall_cells else GOAL if (r, c) == goal else AGENT if (r, c) == start else FREE for c in range(size)) for r in range(size)]
    try:
        return parse_puzzle("\n".join(rows))
    except ValueError:
        return None


def generate_puzzles(split: str, n: int, seed: int, size: int = 4, walls: int = 3, min_dist: int = 2, max_dist: int = 6, heldout_fraction: float = 0.2) -> list[Puzzle]:
    """`n` distinct puzzles of `split` whose shortest path has `min_dist`..`max_dist` moves;
    deterministic in all the arguments."""
    rng = random.Random(f"grid:{split}:{seed}:{size}:{walls}")

    def draw() -> tuple[str, Puzzle] | None:
        p = random_puzzle(rng, size, walls)
        return None if p is None else (p.text, p)

    return draw_distinct(
        n, draw, lambda p: min_dist <= p.shortest <= max_dist and puzzle_split(p, heldout_fraction) == split,
        f"grid: could not draw {n} distinct {split} puzzles of size {size} with {walls} walls and paths of {min_dist}..{max_dist} moves",
        tries_per_item=1000,
    )


def read_puzzle_file(path: str | Path, heldout_fraction: float = 0.2) -> list[tuple[Puzzle, str, str | None, str]]:
    """The puzzles of a JSONL file: one JSON object per line with "grid" (text rows, or a list of
    row strings) and optionally "split" ("train"/"heldout"; default: a hash of the puzzle),
    "hint" (default: the shortest-path map) and "uid" (default: a hash of the puzzle). Blank lines
    are skipped. Returns (puzzle, split, hint, uid) per row; a bad row is a `DataError` naming the
    file and the line."""
    p = Path(path)
    out = []
    uids: dict[str, int] = {}
    for lineno, row, bad in jsonl_objects(p, "grid task_file", "a 'grid'"):
        grid = row.get("grid")
        if isinstance(grid, list) and all(isinstance(r, str) for r in grid):
            grid = "\n".join(grid)
        if not isinstance(grid, str) or not grid.strip():
            raise bad("'grid' must be text rows or a list of row strings")
        try:
            puzzle = parse_puzzle(grid)
        except ValueError as err:
            raise bad(str(err)) from None
        if puzzle.shortest == 0:
            raise bad("the start is the goal")
        split = row.get("split")
        if split is None:
            split = puzzle_split(puzzle, heldout_fraction)
        elif split not in ("train", "heldout"):
            raise bad(f"'split' must be 'train' or 'heldout', got {split!r}")
        hint = row.get("hint")
        if hint is not None and not isinstance(hint, str):
            raise bad(f"'hint' must be text, got {type(hint).__name__}")
        uid = row.get("uid", puzzle_uid(puzzle))
        if not isinstance(uid, (str, int)) or isinstance(uid, bool):
            raise bad(f"'uid' must be text or an integer, got {uid!r}")
        uid = str(uid)
        if uid in uids:
            raise bad(f"uid {uid!r} repeats line {uids[uid]} (the same puzzle twice?)")
        uids[uid] = lineno
        out.append((puzzle, split, hint, uid))
    if not out:
        raise DataError(f"grid task_file {p} has no rows")
    return out


def planner_text(puzzle: Puzzle, pos: tuple[int, int]) -> str:
    """The planner's user message at `pos`."""
    return PLANNER_PREFIX + render(puzzle, pos)


def mover_text(puzzle: Puzzle, pos: tuple[int, int], plan: str | None) -> str:
    """The mover's user message at `pos` after the planner proposed `plan`."""
    return f"{MOVER_PREFIX}{plan if plan in MOVES else NO_PLAN}\n" + render(puzzle, pos)


def read_move(text: str) -> str | None:
    """The move letter a completion commits to: the whole text (stripped) must be one of U, D, L,
    R; anything else is no move."""
    t = text.strip()
    return t if t in MOVES else None


# -- the environment -------------------------------------------------------------------------


class GridEnv(Env):
    """One episode: the position, the turns played, the planner's latest proposal. The puzzle is
    immutable and shared by every copy."""

    __slots__ = ("puzzle", "cap", "pos", "turn", "plan", "moves")

    def __init__(self, puzzle: Puzzle, cap: int) -> None:
        self.puzzle, self.cap = puzzle, cap
        self.pos = puzzle.start
        self.turn = 0
        """Moves committed so far (mover calls)."""
        self.plan: str | None = None
        self.moves = ""
        """The mover's committed letters ("?" for no move)."""

    def copy(self) -> "GridEnv":
        out = object.__new__(GridEnv)
        out.puzzle, out.cap, out.pos, out.turn, out.plan, out.moves = self.puzzle, self.cap, self.pos, self.turn, self.plan, self.moves
        return out

    @property
    def at_goal(self) -> bool:
        return self.pos == self.puzzle.goal

    def observe(self, agent_id: str) -> list[Message]:
        if agent_id == PLANNER:
            return [Message(role="user", content=planner_text(self.puzzle, self.pos))]
        if agent_id == MOVER:
            return [Message(role="user", content=mover_text(self.puzzle, self.pos, self.plan))]
        raise ValueError(f"grid has no agent {agent_id!r}")

    def step(self, agent_id: str, text: str) -> StepResult:
        move = read_move(text)
        good = 1.0 if move is not None and move in self.puzzle.optimal_moves(self.pos) else 0.0
        if agent_id == PLANNER:
            self.plan = move
            return StepResult(good, done=False)
        if agent_id != MOVER:
            raise ValueError(f"grid has no agent {agent_id!r}")
        self.pos = self.puzzle.after(self.pos, move)
        self.turn += 1
        self.moves += move or NO_PLAN
        self.plan = None
        return StepResult(good, done=self.at_goal or self.turn >= self.cap)

    def team_reward(self) -> float:
        return 1.0 if self.at_goal else 0.0
