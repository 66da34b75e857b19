"""Two-player OpenSpiel games as workflows, played in self-play: each seat is one of the team's
agents (`player_0`, `player_1`), on one shared policy or each on its own (`--shared-policy`), and
both players' calls are rows of the `steps` table.

- `tic_tac_toe` (two-player zero-sum): a problem is a position after an opening of 4 random plies
  (x to move); a held-out position is never a train position, nor a mirror image of one, nor
  reachable from one (`pipeline.workflows.games.positions.position_splits`, which also says why the
  shallower openings drop out); its embedded model is `pipeline.workflows.games.model`.
- `bargaining` (negotiation, general-sum; OpenSpiel's Deal-or-No-Deal): a problem is a dealt
  instance (the pool and each player's private values); players alternate offers until one
  answers "Agree" or the offers run out. It has no embedded model: run it with `--model`.

The rules, rewards and illegal-move penalty are `pipeline.workflows.games.env`'s; the evaluation
against a scripted player and against the starting policy is `pipeline.workflows.games.evaluation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from pipeline.errors import ConfigError
from pipeline.rollout.agent import Agent
from pipeline.rollout.workflow import Workflow
from pipeline.types import Problem
from pipeline.workflows.games.env import PLAYERS, SPECS, GameEnv, GameSpec, reward_names
from pipeline.workflows.games.opponents import OPPONENTS
from pipeline.workflows.games.positions import draw_histories, replay

__all__ = ["GameWorkflow", "TicTacToeWorkflow", "BargainingWorkflow", "GAME_WORKFLOWS"]


def _players() -> tuple[Agent, ...]:
    return tuple(Agent(p) for p in PLAYERS)


# The round table's columns: each opponent's win/draw/loss rates of the team's player.
_VERSUS_METRICS = tuple(
    ("team", f"{r}_vs_{opp}", f"{r}_{opp}") for opp in ("scripted", "base") for r in ("win", "draw", "loss")
)
_WINS = tuple(("team", m) for _, m, _ in _VERSUS_METRICS if m.startswith("win_"))
"""The versus metrics that are higher-is-better: a loss rate is lower-is-better, and a draw rate
rises as losses turn into draws and falls as draws turn into wins."""


@dataclass
class GameWorkflow(Workflow):
    """A two-player game in self-play (module docstring). Options (`--workflow-options`):
    `opening` (random plies before a problem starts, even; the game's default), `heldout_fraction`,
    `illegal_penalty` (the local reward of an illegal or unparsable move, which ends the game),
    `opponent` (the scripted player of the evaluation: tic_tac_toe "heuristic" (default) or
    "random"; bargaining "random"), `base_model` (the starting policy the evaluation plays against;
    default: the workflow's embedded model), `reward` (how a call is rewarded:
    `pipeline.workflows.games.env.REWARDS`; tic_tac_toe "best" (default) or "value"), `team` (the
    self-play team reward, `pipeline.workflows.games.env.TEAMS`: tic_tac_toe "legal" (default),
    bargaining "joint" (default), or "outcome": each player's own result of the game on its rows,
    for a loss that weighs the global reward, e.g. `--loss ppo --alpha 1 --local-weight 0`; the
    evaluation's self-play and the baselines keep the game's default team reward, so their numbers
    read the same under either)."""

    opening: int | None = None
    heldout_fraction: float = 0.3
    illegal_penalty: float = -1.0
    opponent: str | None = None
    base_model: str | None = None
    reward: str | None = None
    team: str | None = None
    agents: tuple[Agent, ...] = field(default_factory=_players)

    spec: ClassVar[GameSpec]
    supports_feedback: ClassVar[bool] = False
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (("team", "success", "selfplay"),) + _VERSUS_METRICS
    judged_metrics: ClassVar[tuple[tuple[str, str], ...] | None] = (("team", "success"),) + _WINS

    def __post_init__(self) -> None:
        name = self.spec.name
        if self.opening is None:
            self.opening = self.spec.opening
        if isinstance(self.opening, bool) or not isinstance(self.opening, int) or self.opening < 0 or self.opening % 2:
            raise ConfigError(f"workflow {name!r}: opening must be an even integer >= 0 (plies before the problem starts), got {self.opening!r}")
        if not (isinstance(self.heldout_fraction, (int, float)) and 0 < self.heldout_fraction < 1):
            raise ConfigError(f"workflow {name!r}: heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}")
        if isinstance(self.illegal_penalty, bool) or not isinstance(self.illegal_penalty, (int, float)):
            raise ConfigError(f"workflow {name!r}: illegal_penalty must be a number, got {self.illegal_penalty!r}")
        self.reward, self.team = reward_names(self.spec, self.reward, self.team, f"workflow {name!r}")
        scripted = OPPONENTS[name]
        self.opponent = self.opponent or next(iter(scripted))
        if self.opponent not in scripted:
            raise ConfigError(f"workflow {name!r}: unknown opponent {self.opponent!r}; choose from {list(scripted)}")
        self.agents = tuple(self.agents)
        ids = [a.agent_id for a in self.agents]
        if sorted(ids) != list(PLAYERS):
            raise ConfigError(f"workflow {name!r} needs the agents {list(PLAYERS)}, got {ids}")

    # -- the contract -----------------------------------------------------------------------
    @property
    def max_turns(self) -> int:
        return self.spec.max_turns

    @property
    def turn_order(self) -> tuple[str, ...]:
        return PLAYERS

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        if split not in ("train", "heldout"):
            raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
        histories = draw_histories(self.spec, split, n, seed, self.opening, self.heldout_fraction)
        return [Problem(uid=f"{self.spec.name}:{h}", question=h, answer="", split=split, meta=(("task", self.spec.name),)) for h in histories]

    def table(self, problem: Problem):
        """The game at the problem's position (its history replayed)."""
        try:
            return replay(self.spec, problem.question, seed=problem.uid)
        except ConfigError:  # the games extra missing
            raise
        except Exception as err:  # noqa: BLE001 - a stored problem may name moves this game refuses
            raise ConfigError(f"workflow {self.spec.name!r}: problem {problem.uid!r} is not a history of legal moves ({err})") from None

    def reset(self, problem: Problem, strategy) -> GameEnv:
        return GameEnv(self.spec, self.table(problem), {p: i for i, p in enumerate(PLAYERS)}, self.illegal_penalty, reward=self.reward, team=self.team)

    def scored_as_a_team(self) -> "GameWorkflow":
        """This workflow with the game's default team reward (one number per episode: a legal
        finish, the joint deal value), what the evaluation's self-play and the baselines score;
        itself when it already has it (`team="outcome"` gives one value per side)."""
        return self if self.team == self.spec.team else replace(self, team=self.spec.team)

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        return 4 if self.spec.name == "tic_tac_toe" else 48

    def evaluate(self, samplers, tokenizers, config, round_: int):
        """Self-play on the held-out positions (the default evaluation), then the team's player in
        each seat against the scripted player and against the starting policy
        (`pipeline.workflows.games.evaluation.evaluate_game`)."""
        from pipeline.workflows.games.evaluation import evaluate_game

        return evaluate_game(self, samplers, tokenizers, config, round_)


@dataclass
class TicTacToeWorkflow(GameWorkflow):
    spec: ClassVar[GameSpec] = SPECS["tic_tac_toe"]
    name: ClassVar[str] = "tic_tac_toe"
    run_defaults: ClassVar[dict[str, object]] = {"problems": 256, "samples": 8}
    """Four times the library's samples a round (256 positions of the 496 the train split holds,
    groups of 8): at the library's 128 x 4 five rounds of self-play learn the game's tactics about
    two thirds as far (docs/results/games.md)."""

    def default_model(self):
        from pipeline.workflows.games.model import ttt_model

        return ttt_model()


@dataclass
class BargainingWorkflow(GameWorkflow):
    spec: ClassVar[GameSpec] = SPECS["bargaining"]
    name: ClassVar[str] = "bargaining"
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (("team", "team_reward", "joint_value"),) + _VERSUS_METRICS
    judged_metrics: ClassVar[tuple[tuple[str, str], ...] | None] = (("team", "team_reward"),) + _WINS


GAME_WORKFLOWS = {"tic_tac_toe": TicTacToeWorkflow, "bargaining": BargainingWorkflow}
