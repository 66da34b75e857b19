"""The reasoning-gym workflow: any of reasoning-gym's procedural datasets, scored by its own
`score_answer`, played by a team of maxit agents.

    maxit run --workflow reasoning_gym --workflow-options dataset=basic_arithmetic max_terms=2 max_digits=1
    maxit run --workflow reasoning_gym --workflow-options dataset=number_sequence team=single

`--workflow-options`: `dataset=NAME` (required), the dataset's generator options by their names
(numbers, true/false, strings; a list option as "a,b"), and the workflow's own (`ReasoningGymWorkflow`'s parameters:
`team` single | solver_verifier (default) | tool_plan, `max_loop_num`, `heldout_fraction`,
`max_tokens`, and the tool_plan sandbox's). An unknown dataset or option is a one-line error
listing the datasets or the options the dataset takes. Offline: reasoning-gym generates every
item locally; it comes with the `envs` extra (`pip install -e .[envs]`, scripts/setup.sh), and
nothing else in `pipeline/` imports it.

The parts: `datasets.py` (the import guard, the options, `ReasoningGymTask`: splits by question
text, the dataset's scorer as the reward, the entry stored with each problem), `answering.py` (what
the teams share: the default model, `rescore_steps`), `workflow.py` (the teams), `tool_plan.py` (the tool and plan agents, the sandbox), `model.py` (the
embedded default model, warm-started on the dataset's train split).
"""

from pipeline.workflows.reasoning_gym.datasets import (
    EXTRA,
    ReasoningGymTask,
    answers_agree,
    dataset_names,
    dataset_options,
    extract_answer,
    generator_options,
    import_reasoning_gym,
)
from pipeline.workflows.reasoning_gym.answering import AnsweringTeam, rescore_steps
from pipeline.workflows.reasoning_gym.workflow import TEAMS, ReasoningGymWorkflow, SingleSolver, SolverVerifierTeam

__all__ = [
    "AnsweringTeam", "EXTRA", "ReasoningGymTask", "ReasoningGymWorkflow", "SingleSolver", "SolverVerifierTeam", "TEAMS", "answers_agree",
    "dataset_names", "dataset_options", "extract_answer", "generator_options", "import_reasoning_gym", "rescore_steps",
]
