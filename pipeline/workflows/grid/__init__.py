"""The grid game: a planner and a mover find a path through a maze over several turns
(`workflow.py`); the game itself (`game.py`); its embedded model, built and warm-started on the
game (`model.py`)."""

from pipeline.workflows.grid.game import MOVER, MOVES, PLANNER, GridEnv, Puzzle, generate_puzzles, mover_text, parse_puzzle, planner_text, read_puzzle_file
from pipeline.workflows.grid.workflow import GridWorkflow

__all__ = ["GridWorkflow", "GridEnv", "Puzzle", "parse_puzzle", "generate_puzzles", "read_puzzle_file", "planner_text", "mover_text", "MOVES", "PLANNER", "MOVER"]
