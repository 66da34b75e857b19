"""The games' rules as maxit sees them: each game's spec (`GameSpec`: its OpenSpiel name, how
each player's call is rewarded, the team reward), what a player sees and answers, and the
environment of one episode (`GameEnv`). Its problems (dealt and opened positions) are
`pipeline.workflows.games.positions`, the scripted opponents `pipeline.workflows.games.opponents`.

What an agent sees: one user message, its game and seat on the first line ("tic_tac_toe x",
"bargaining p1") and OpenSpiel's own text observation for that player below it, except that
tic-tac-toe's board is one line of cells, each its content and number ("cells: x0 .1 o2 .3 x4 .5 .6
.7 .8", `GameSpec.board_cells`; a game may instead list the mover's legal actions on a last line,
`GameSpec.list_moves`). What it answers:
the number of a legal action (tic-tac-toe: the cell 0-8, row by row) or the action's OpenSpiel
text ("Agree", "Offer: Book: 1, Hat: 0, Basketball: 0"); `read_action` checks it against the
legal actions before anything is applied.

An illegal or unparsable move ends the game (it is not replaced by another move): the mover's
call gets the local reward `illegal_penalty` and forfeits (a loss in the win/draw/loss count, the
other player's win); in the negotiation there is then no deal.

Local rewards, per call (per-player rewards): tic-tac-toe (`reward="best"`, the default): 1.0 when
the move is optimal (its minimax result is the best the mover could get from the position), else
0.0, so the default "rs" loss (reward >= 1) trains every optimal move, drawing ones included;
(`reward="value"`): the result the mover's move secures, the mover's utility of the position it
reached under optimal play from there (exact minimax; the game's actual utility when the move ends
it) on the scale 1 win, 0.5 draw, 0 loss, for losses that weigh moves by their value (with "rs"
it would train only the moves that keep a won game won). Bargaining
(`reward="outcome"`): the mover's utility (its deal value / 10) when its move ends the game, else 0;
the workflow contract scores a call when it is made, so the other player's share of a deal reaches
its rows through the team reward (the joint deal value), not its local reward.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from pipeline.rollout.contract import Env, StepResult
from pipeline.errors import ConfigError
from pipeline.types import Message
from pipeline.workflows.games.spiel import Table, best_moves, solved_value

__all__ = ["GameSpec", "GameEnv", "SPECS", "REWARDS", "TEAMS", "PLAYERS", "read_action", "prompt_text", "reward_names"]

PLAYERS = ("player_0", "player_1")
"""The agents: one per seat (OpenSpiel's players 0 and 1)."""


@dataclass(frozen=True)
class GameSpec:
    """A two-player OpenSpiel game as a maxit workflow plays it."""

    name: str
    """OpenSpiel's name of the game (and the workflow's)."""
    roles: tuple[str, str]
    """What each seat is called on the prompt's first line."""
    reward: str
    """The default local reward, one of the game's `REWARDS`: "best" (an optimal move), "value" (the
    mover's minimax value after its move, as 1 win, 0.5 draw, 0 loss: exact, small zero-sum games)
    or "outcome" (the mover's utility when its move ends the game, else 0)."""
    scale: float
    """Utilities are divided by this (bargaining's deal values run to 10; tic-tac-toe's are +-1)."""
    team: str
    """The default team reward in self-play (one of the game's `TEAMS`): "legal" (1.0 when the
    game ended without a forfeit) or "joint" (the players' summed utilities / (2 * scale): the
    deal's value to both)."""
    outcome: str
    """What each player gets under the team reward "outcome" (one value per side): "result" (1
    win, 0.5 draw, 0 loss; a forfeit loses) or "utility" (its own utility / scale; 0 after a
    forfeit: no deal)."""
    opening: int
    """Default of the workflow's `opening`: random plies (even counts, the first seat to move)
    played before the problem starts."""
    max_turns: int
    """Turns at most (each seat moves once per turn)."""
    list_moves: bool = False
    """The prompt's last line lists the mover's legal actions ("moves: 0 2 5"), as TextArena's
    board games show their available moves: the model picks from the list rather than working
    out from the board which cells are free. Only where the actions are few and short."""
    board_cells: bool = False
    """The observation (a board of one character per cell, rows on lines) is shown as one line of
    cells, each its content and its number, the action that plays there ("cells: x0 .1 o2 ..."),
    in place of OpenSpiel's grid: every cell says where it is, so a model reads the board without
    counting characters, and the free cells (".1") are the legal moves."""
    square_board: int = 0
    """Side of the square board when the game is the same under its rotations and reflections
    (tic-tac-toe: 3), so a position and its mirror images are one problem and share a split
    (`position_class`); 0 where it is not."""


TEAMS = {"tic_tac_toe": ("legal", "outcome"), "bargaining": ("joint", "outcome")}
"""The team rewards a game offers in self-play (the workflow's `team` option; `GameSpec.team` is the
default). "outcome": one value per side (`Env.team_reward`'s mapping), each player's own result of
the game (`GameSpec.outcome`), so every row of a player carries how its game went for it, SPIRAL's
self-play reward; a loss that weighs the global reward (alpha > 0) trains on it, and `--baseline
role` is then SPIRAL's role-conditioned advantage on it."""

REWARDS = {"tic_tac_toe": ("best", "value"), "bargaining": ("outcome",)}
"""The local rewards a game offers (the workflow's `reward` option; `GameSpec.reward` is the default).
"best": 1.0 when the move's minimax result is the best the mover could get from the position (an
optimal move, the grid's rule: the default "rs" loss trains exactly these), else 0.0."""

SPECS = {
    "tic_tac_toe": GameSpec("tic_tac_toe", ("x", "o"), reward="best", scale=1.0, team="legal", outcome="result", opening=4, max_turns=5, board_cells=True,
                            square_board=3),
    "bargaining": GameSpec("bargaining", ("p0", "p1"), reward="outcome", scale=10.0, team="joint", outcome="utility", opening=0, max_turns=5),
}


def prompt_text(spec: GameSpec, table: Table, player: int) -> str:
    """The user message of `player`: game and seat, then OpenSpiel's observation for it (as a line
    of numbered cells where the spec says so), then (where the spec lists them) the legal actions
    of the player to move."""
    observation = table.observation(player)
    if spec.board_cells:
        observation = "cells: " + " ".join(f"{c}{i}" for i, c in enumerate(observation.replace("\n", "")))
    text = f"{spec.name} {spec.roles[player]}\n{observation}"
    if spec.list_moves and not table.done and table.agent_selection == player:
        text += "\nmoves: " + " ".join(map(str, table.legal()))
    return text


def read_action(text: str, table: Table) -> int | None:
    """The legal action a completion names: its whole text (stripped) is the number of a legal
    action or, ignoring case, a legal action's OpenSpiel text; anything else is None."""
    t = text.strip()
    legal = table.legal()
    if t.lstrip("-").isdigit():
        return int(t) if int(t) in legal else None
    by_text = {table.action_text(a).strip().lower(): a for a in legal}
    return by_text.get(t.lower())


# -- the environment ----------------------------------------------------------------------------


def reward_names(spec: GameSpec, reward: str | None, team: str | None, who: str) -> tuple[str, str]:
    """`reward` and `team` (None: the spec's), each checked against the game's `REWARDS` and
    `TEAMS`: an unknown name is a `ConfigError` from `who` listing the known ones."""
    reward, team = reward or spec.reward, team or spec.team
    if reward not in REWARDS[spec.name]:
        raise ConfigError(f"{who}: unknown reward {reward!r}; choose from {list(REWARDS[spec.name])}")
    if team not in TEAMS[spec.name]:
        raise ConfigError(f"{who}: unknown team reward {team!r}; choose from {list(TEAMS[spec.name])}")
    return reward, team


class GameEnv(Env):
    """One game. `seats` maps the agents that play to their players; a seat no agent holds is
    played by `opponent` (a scripted player) inside `step`. `judge`: the seat whose result is the
    team reward (evaluation against an opponent: 1 win, 0.5 draw, 0 loss); None in self-play,
    where `team` (`TEAMS`, the spec's by default) says what the team reward is."""

    def __init__(self, spec: GameSpec, table: Table, seats: dict[str, int], penalty: float,
                 opponent: Callable[[Table, random.Random], int] | None = None, judge: int | None = None, seed: str = "", reward: str | None = None,
                 team: str | None = None) -> None:
        self.spec, self.table, self.seats, self.penalty = spec, table, dict(seats), float(penalty)
        # checked here too, not only by the workflow: in an environment built directly an unknown
        # name would only surface as a missing reward at the game's end
        self.reward, self.team = reward_names(spec, reward, team, spec.name)
        """How a call is rewarded (`REWARDS`) and the self-play team reward (`TEAMS`); the spec's by default."""
        self.opponent, self.judge = opponent, judge
        self.rng = random.Random(f"opponent:{seed}")
        self.forfeit: int | None = None
        """The seat that made an illegal or unparsable move (the game ended there)."""
        self._opponent_moves()

    def copy(self) -> "GameEnv":
        out = object.__new__(GameEnv)
        out.__dict__.update(self.__dict__)
        out.table = self.table.clone()
        out.rng = random.Random()
        out.rng.setstate(self.rng.getstate())
        return out

    @property
    def over(self) -> bool:
        return self.forfeit is not None or self.table.done

    def _opponent_moves(self) -> None:
        held = set(self.seats.values())
        while self.opponent is not None and not self.table.done and self.table.agent_selection not in held:
            self.table.step(self.opponent(self.table, self.rng))

    def _seat(self, agent_id: str) -> int:
        if agent_id not in self.seats:
            raise ValueError(f"{self.spec.name} has no agent {agent_id!r} at this table")
        return self.seats[agent_id]

    def observe(self, agent_id: str) -> list[Message]:
        return [Message(role="user", content=prompt_text(self.spec, self.table, self._seat(agent_id)))]

    def step(self, agent_id: str, text: str) -> StepResult:
        seat = self._seat(agent_id)
        if self.over:  # the scripted opponent, moving first, ended the game before this call
            return StepResult(None, done=True, error="the game was over before this call")
        if self.table.agent_selection != seat:
            raise ValueError(f"{self.spec.name}: {agent_id} called out of turn")
        action = read_action(text, self.table)
        if action is None:
            self.forfeit = seat
            return StepResult(self.penalty, done=True)
        best = best_moves(self.table) if self.reward == "best" else ()
        self.table.step(action)
        if self.reward == "best":
            reward = 1.0 if action in best else 0.0
        elif self.reward == "value":
            reward = (solved_value(self.table, seat) / self.spec.scale + 1.0) / 2.0
        else:
            reward = self.table.rewards()[seat] / self.spec.scale if self.table.done else 0.0
        self._opponent_moves()
        return StepResult(reward, done=self.over)

    def result(self, seat: int) -> float:
        """`seat`'s result: 1 win, 0.5 draw, 0 loss (a forfeit loses; an unfinished game draws)."""
        if self.forfeit is not None:
            return 0.0 if self.forfeit == seat else 1.0
        r = self.table.rewards()
        other = max(v for s, v in enumerate(r) if s != seat)
        return 1.0 if r[seat] > other else 0.5 if r[seat] == other else 0.0

    def outcome(self, seat: int) -> float:
        """`seat`'s own result of the game as it stands (`GameSpec.outcome`); an unfinished game
        is a draw (0.5) or no deal yet (0.0)."""
        if self.spec.outcome == "result":
            return self.result(seat)
        return 0.0 if self.forfeit is not None else self.table.rewards()[seat] / self.spec.scale

    def team_reward(self) -> float | dict[str, float]:
        if self.judge is not None:
            return self.result(self.judge)
        if self.team == "outcome":
            return {agent_id: self.outcome(seat) for agent_id, seat in self.seats.items()}
        if self.team == "legal":
            return 1.0 if self.forfeit is None and self.table.done else 0.0
        if self.forfeit is not None:
            return 0.0
        return sum(self.table.rewards()) / (len(self.table.rewards()) * self.spec.scale)
