"""The math workflows: `math` (a Solver and a Verifier, DrMAS's team) and `single` (the Solver
alone) on a task with a checkable answer (`workflow.py`) and their held-out evaluation
(`evaluation.py`); the Solver/Verifier orchestra and role views (`orchestra.py`); the embedded
default model built and warm-started on the arithmetic task (`model.py`, `warmstart.py`)."""

from pipeline.workflows.math.evaluation import evaluate_team
from pipeline.workflows.math.workflow import MathEnv, MathWorkflow, SingleWorkflow

__all__ = ["MathWorkflow", "SingleWorkflow", "MathEnv", "evaluate_team"]
