"""The Plan-Path game: the tool's executor, what each agent sees, rewards, and the environment of
one episode. `pipeline.workflows.plan_path.workflow` is the workflow on it; the embedded model's
build (`pipeline.workflows.plan_path.model`) warm-starts on it. The mazes are the grid game's
(`pipeline.workflows.grid.game`: 4 x 4 by default, walls "#", goal "G", the team at "A").

A path is text of 1..`MAX_PATH` move letters U, D, L, R (surrounding blanks ignored). Running it
(`run_path`) moves from a position letter by letter and stops at the first of: the goal, a move
into a wall or off the grid, the end of the path. Its output is one short line:

- `goal N`: the goal is reached by move N (letters after it are not run);
- `wall N`: move N runs into a wall or off the grid (the moves before it ran);
- `end N`:  all N moves ran and ended off the goal;
- `bad`:    the text is not a path (empty, another character, longer than `MAX_PATH`).

Model-written text is hostile input: any text (any object at all) gives one of these outputs,
never an exception.

One turn: the tool agent writes a path that the environment RUNS as a trial (the position does
not change), and the plan agent, shown the maze, the call and the trial's output, writes the
path it commits: that path is run for real, and the team stands where it stopped. Several turns
(`turns`) from where the last commit left the team; the episode ends at the goal or after the last
turn.

What each agent sees (one user message; the embedded model's context is 256 tokens):
- tool:  "path\\n" + the grid with "A" at the team's position;
- plan:  "plan\\n" + the same grid + "\\ncall " + the call's letters ("?" for a bad call) +
  "\\n" + the trial's output line;
- the single agent (`team=single`, the plan agent's seat without the tool): the tool's prompt,
  and its path is committed directly.

Rewards: the tool's local reward is 1.0 when its trial reaches the goal, the plan agent's (and
the single agent's) 1.0 when its committed path reaches the goal, else 0.0; the team reward is
1.0 when the team stands on the goal.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.rollout.contract import Env, StepResult
from pipeline.types import Message
from pipeline.workflows.grid.game import MOVES, Puzzle, render

__all__ = [
    "TOOL",
    "PLAN",
    "MAX_PATH",
    "Trial",
    "read_path",
    "run_path",
    "tool_text",
    "plan_text",
    "parse_plan_text",
    "PlanPathEnv",
]

TOOL = "tool"
PLAN = "plan"
MAX_PATH = 12
"""Most letters a path may have (a 4 x 4 maze's paths are at most a dozen moves)."""
TOOL_PREFIX = "path\n"
PLAN_PREFIX = "plan\n"
CALL_PREFIX = "call "
BAD_CALL = "?"
"""What the plan agent is shown as the call when the tool's text was not a path."""


@dataclass(frozen=True)
class Trial:
    """One path run from a position: the letters read (None: not a path), the output line,
    whether it reached the goal, where it stopped, and the letters that ran."""

    moves: str | None
    output: str
    reached: bool
    end: tuple[int, int]
    ran: str = ""


def read_path(text) -> str | None:
    """The path a text writes: its stripped content when that is 1..`MAX_PATH` letters of U, D,
    L, R; anything else (including a non-string) is None."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    if not t or len(t) > MAX_PATH or any(ch not in MOVES for ch in t):
        return None
    return t


def run_path(puzzle: Puzzle, pos: tuple[int, int], text) -> Trial:
    """Run the path `text` writes from `pos`, move by move (the module docstring's outputs)."""
    moves = read_path(text)
    if moves is None:
        return Trial(None, "bad", False, pos)
    for i, move in enumerate(moves, 1):
        nxt = puzzle.after(pos, move)
        if nxt == pos:  # a wall or the grid's edge: `after` leaves the position unchanged
            return Trial(moves, f"wall {i}", False, pos, moves[: i - 1])
        pos = nxt
        if pos == puzzle.goal:
            return Trial(moves, f"goal {i}", True, pos, moves[:i])
    return Trial(moves, f"end {len(moves)}", False, pos, moves)


def tool_text(puzzle: Puzzle, pos: tuple[int, int]) -> str:
    """The tool agent's (and the single agent's) user message at `pos`."""
    return TOOL_PREFIX + render(puzzle, pos)


def plan_text(puzzle: Puzzle, pos: tuple[int, int], trial: Trial | None) -> str:
    """The plan agent's user message at `pos` after the tool's `trial` (None: no call was made)."""
    call = trial.moves if trial is not None and trial.moves is not None else BAD_CALL
    output = trial.output if trial is not None else "bad"
    return f"{PLAN_PREFIX}{render(puzzle, pos)}\n{CALL_PREFIX}{call}\n{output}"


def parse_plan_text(content: str) -> tuple[str | None, str] | None:
    """(call letters or None, output line) of a plan agent's user message, or None when the text is
    not one (the workflow's metrics read them back from the steps table)."""
    if not isinstance(content, str) or not content.startswith(PLAN_PREFIX):
        return None
    lines = content.split("\n")
    if len(lines) < 3 or not lines[-2].startswith(CALL_PREFIX):
        return None
    call = lines[-2][len(CALL_PREFIX):]
    return (None if call == BAD_CALL else call), lines[-1]


class PlanPathEnv(Env):
    """One episode: the team's position, the turns played, the tool's latest trial. The puzzle is
    immutable and shared by every copy. `single`: the single agent's episode, the plan agent's
    seat without the tool: it is shown the tool's prompt, and its path is committed."""

    __slots__ = ("puzzle", "turns", "single", "pos", "turn", "trial", "path")

    def __init__(self, puzzle: Puzzle, turns: int, single: bool = False) -> None:
        self.puzzle, self.turns, self.single = puzzle, turns, single
        self.pos = puzzle.start
        self.turn = 0
        """Commits so far (plan or single agent calls)."""
        self.trial: Trial | None = None
        self.path = ""
        """The letters committed and run so far."""

    def copy(self) -> "PlanPathEnv":
        out = object.__new__(PlanPathEnv)
        out.puzzle, out.turns, out.single = self.puzzle, self.turns, self.single
        out.pos, out.turn, out.trial, out.path = self.pos, self.turn, self.trial, self.path
        return out

    @property
    def at_goal(self) -> bool:
        return self.pos == self.puzzle.goal

    def observe(self, agent_id: str) -> list[Message]:
        if agent_id == TOOL or (agent_id == PLAN and self.single):
            return [Message(role="user", content=tool_text(self.puzzle, self.pos))]
        if agent_id == PLAN:
            return [Message(role="user", content=plan_text(self.puzzle, self.pos, self.trial))]
        raise ValueError(f"plan_path has no agent {agent_id!r}")

    def step(self, agent_id: str, text: str) -> StepResult:
        if agent_id == TOOL:
            self.trial = run_path(self.puzzle, self.pos, text)
            return StepResult(1.0 if self.trial.reached else 0.0, done=False)
        if agent_id != PLAN:
            raise ValueError(f"plan_path has no agent {agent_id!r}")
        commit = run_path(self.puzzle, self.pos, text)
        self.pos = commit.end
        self.path += commit.ran
        self.turn += 1
        self.trial = None
        return StepResult(1.0 if commit.reached else 0.0, done=self.at_goal or self.turn >= self.turns)

    def team_reward(self) -> float:
        return 1.0 if self.at_goal else 0.0
