"""The grid workflow: a planner and a mover find a path through a small maze, turn by turn.

The game itself (puzzles, what each agent sees, rewards, `GridEnv`) is
`pipeline.workflows.grid.game`, re-exported here: below the embedded model's build
(`pipeline.workflows.grid.model`, which warm-starts on it), which `default_model` calls.

Problems: `problems(split, n, seed)` draws puzzles (deterministic per split, n, seed and the game
options); a puzzle's split is a hash of its text, so train and held-out never share one.
`GridWorkflow(task_file=...)` reads puzzles from a JSONL file instead (`read_puzzle_file`: bad rows
are `DataError`s naming the line). The hint (prompt_aug, shown to the planner) is the grid with the
move to take written on every cell of one shortest path from the start: on that path the letter at
the team's own cell is the next move.

The tree strategy copies the environment at every candidate (`GridEnv.copy`: a few scalars; the
puzzle and its distances are shared, immutable). Feedback is not supported (the default strategy
mix runs iid, prompt_aug and tree on it).

Embedded model (`default_model`): `pipeline.workflows.grid.model`, a tiny Llama with a character-level
tokenizer warm-started on the game in code, one build per game options; what the team learns in
five default rounds is in docs/results/grid.md.

Budget-matched baselines and arms (`pipeline.rollout.budget_matched`, `pipeline.run.arms`): the
single agent is ONE agent committing a move each turn: the planner's prompt (the grid and its
position, all a move needs), its letter committed as the move, one call per turn (`single_agent`);
answers compare by the move letter. The team's protocol played by one agent (the planner's id in
both seats, two calls a turn) is the `protocol` arm. `model_scale=N` makes the embedded model N
times as deep (about N times the parameters, its own build): the `wide` arm's single agent, with
the parameters of the team of a policy per agent.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.rollout.agent import Agent
from pipeline.errors import ConfigError
from pipeline.models.build import check_model_scale
from pipeline.types import Problem
from pipeline.rollout.workflow import SoloWorkflow, Workflow
from pipeline.workflows.grid.game import (
    MAX_CELLS,
    MOVER,
    MOVER_PREFIX,
    MOVES,
    NO_PLAN,
    PLANNER,
    GridEnv,
    Puzzle,
    generate_puzzles,
    mover_text,
    parse_puzzle,
    planner_text,
    puzzle_uid,
    read_move,
    read_puzzle_file,
)

__all__ = [
    "GridWorkflow",
    "GridEnv",
    "Puzzle",
    "parse_puzzle",
    "generate_puzzles",
    "read_puzzle_file",
    "planner_text",
    "mover_text",
    "MOVES",
    "PLANNER",
    "MOVER",
]


# -- the workflow ----------------------------------------------------------------------------


def _default_agents() -> tuple[Agent, ...]:
    return (Agent(PLANNER), Agent(MOVER))


@dataclass
class GridWorkflow(Workflow):
    """A planner and a mover on the grid game (see the module docstring). Options (`maxit run
    --workflow grid --workflow-options size=5 walls=5 ...`): the generator's `size`, `walls`,
    `min_dist`, `max_dist`, `heldout_fraction`, and `slack` (turns allowed beyond the shortest
    path); `max_loop_num` caps every episode at that many turns instead; `task_file` reads puzzles
    from a JSONL file (`read_puzzle_file`)."""

    task_file: str | None = None
    max_loop_num: int | None = None
    size: int = 4
    walls: int = 3
    min_dist: int = 2
    max_dist: int = 6
    slack: int = 2
    heldout_fraction: float = 0.2
    model_scale: int = 1
    agents: tuple[Agent, ...] = field(default_factory=_default_agents)

    name: ClassVar[str] = "grid"
    supports_feedback: ClassVar[bool] = False
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("team", "success", "success"),
        ("team", "success_greedy", "greedy"),
        (PLANNER, "reward", "planner_reward"),
        (MOVER, "reward", "mover_reward"),
        (MOVER, "follows_plan", "mover_follows"),
    )

    def __post_init__(self) -> None:
        def whole(name: str, low: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"workflow 'grid': {name} must be an integer >= {low}, got {v!r}")

        for name, low in (("size", 2), ("walls", 0), ("min_dist", 1), ("max_dist", 1), ("slack", 0)):
            whole(name, low)
        check_model_scale(self.name, self.model_scale)
        if self.max_loop_num is not None:
            whole("max_loop_num", 1)
        if self.size * self.size > MAX_CELLS:
            raise ConfigError(f"workflow 'grid': size {self.size} gives {self.size ** 2} cells; at most {MAX_CELLS} fit the prompt")
        if self.walls > self.size * self.size - 2:
            raise ConfigError(f"workflow 'grid': {self.walls} walls leave no room for a start and a goal on a {self.size}x{self.size} grid")
        if self.min_dist > self.max_dist:
            raise ConfigError(f"workflow 'grid': min_dist {self.min_dist} > max_dist {self.max_dist}")
        if not (isinstance(self.heldout_fraction, (int, float)) and 0 < self.heldout_fraction < 1):
            raise ConfigError(f"workflow 'grid': heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}")
        self.agents = tuple(self.agents)
        ids = [a.agent_id for a in self.agents]
        if sorted(ids) != sorted((PLANNER, MOVER)):
            raise ConfigError(f"workflow 'grid' needs the agents {[PLANNER, MOVER]}, got {ids}")
        self._file: dict[str, list[Problem]] | None = None
        longest = self.max_dist
        if self.task_file is not None:
            rows = read_puzzle_file(self.task_file, self.heldout_fraction)
            self._file = {"train": [], "heldout": []}
            for puzzle, split, hint, uid in rows:
                self._file[split].append(self._problem(puzzle, split, hint, uid))
            longest = max(p.shortest for p, *_ in rows)
        self._turns = self.max_loop_num if self.max_loop_num is not None else longest + self.slack

    # -- the contract -----------------------------------------------------------------------
    @property
    def max_turns(self) -> int:
        return self._turns

    @property
    def turn_order(self) -> tuple[str, ...]:
        return (PLANNER, MOVER)

    @property
    def hinted_agents(self) -> tuple[str, ...]:
        return (PLANNER,)

    def _problem(self, puzzle: Puzzle, split: str, hint: str | None = None, uid: str | None = None) -> Problem:
        return Problem(
            uid=uid or puzzle_uid(puzzle),
            question=puzzle.text,
            answer=puzzle.path(),
            split=split,
            hint=hint if hint is not None else puzzle.hint(),
            meta=(("task", "grid"), ("shortest", str(puzzle.shortest))),
        )

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        if split not in ("train", "heldout"):
            raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
        if self._file is not None:
            pool = list(self._file[split])
            random.Random(f"grid-file:{split}:{seed}").shuffle(pool)
            return pool[:n]
        puzzles = generate_puzzles(split, n, seed, self.size, self.walls, self.min_dist, self.max_dist, self.heldout_fraction)
        return [self._problem(p, split) for p in puzzles]

    def cap(self, puzzle: Puzzle) -> int:
        """Turns allowed on `puzzle`: `max_loop_num`, else its shortest path + `slack`."""
        return self.max_loop_num if self.max_loop_num is not None else puzzle.shortest + self.slack

    def reset(self, problem: Problem, strategy) -> GridEnv:
        puzzle = parse_puzzle(problem.question)
        return GridEnv(puzzle, self.cap(puzzle))

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        return 4  # one letter and the end token; a little room to be wrong

    def default_model(self):
        from pipeline.workflows.grid.model import GridGame, grid_model

        if self.task_file is not None:  # puzzles of any shape: the model of the default game
            return grid_model(scale=self.model_scale)
        return grid_model(game=GridGame(self.size, self.walls, self.min_dist, self.max_dist, self.heldout_fraction, self.slack), scale=self.model_scale)

    # -- the budget-matched baselines: one agent playing both roles, its moves compared
    compares_answers: ClassVar[bool] = True

    def single_agent(self) -> SoloWorkflow:
        """One agent committing a move each turn: the planner's call, its letter committed as the
        move (the mover steps the same text without a call of its own), one call per turn."""
        return SoloWorkflow(self, PLANNER, seats=(PLANNER,), echo=(MOVER,))

    def answer_key(self, agent_id: str, text: str) -> str | None:
        """The move letter the text names (`read_move`), None when it names none."""
        return read_move(text)

    def metrics(self, steps) -> list[tuple[str, str, float, int]]:
        """Extra evaluation rows: how often the mover commits the planner's proposal."""
        import polars as pl

        movers = steps.filter(pl.col("agent_id") == MOVER)
        if not movers.height:
            return []
        plans = movers["sampling_messages"].map_elements(lambda m: m[-1]["content"][len(MOVER_PREFIX)], return_dtype=pl.String)
        moves = movers["completion_text"].map_elements(lambda t: read_move(t) or NO_PLAN, return_dtype=pl.String)
        same = [p == m and p in MOVES for p, m in zip(plans.to_list(), moves.to_list())]
        return [(MOVER, "follows_plan", sum(same) / len(same), len(same))]
