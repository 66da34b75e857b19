"""Two-player games from OpenSpiel as workflows, played in self-play (`workflow.py`): tic-tac-toe
(zero-sum, with an embedded model, `model.py`) and bargaining (a negotiation). The adapter to
OpenSpiel (`spiel.py`, the only module that imports pyspiel: the `games` extra), the rules and
rewards (`env.py`), the evaluation against a scripted player and the starting policy
(`evaluation.py`)."""

from pipeline.workflows.games.env import GameEnv, GameSpec, PLAYERS, SPECS, read_action
from pipeline.workflows.games.workflow import GAME_WORKFLOWS, BargainingWorkflow, GameWorkflow, TicTacToeWorkflow

__all__ = ["GameWorkflow", "TicTacToeWorkflow", "BargainingWorkflow", "GAME_WORKFLOWS", "GameEnv", "GameSpec", "PLAYERS", "SPECS", "read_action"]
