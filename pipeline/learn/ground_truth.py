"""Baselines that tell whether expert iteration helps beyond more training steps.

`ground_truth_view`: supervised rows of the Solver answering each problem with its reference
answer (the task's own format, EOS included) in the `training_view` schema. Trained with the
"rs" loss (plain NLL, every row's reward is 1) for as many optimizer steps as an expert-iteration
round takes, it is the step-matched SFT-on-ground-truth baseline of the ablation.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from pipeline.types import Problem
from schemas import TRAINING_VIEW, validate

__all__ = ["ground_truth_view"]


def ground_truth_view(
    problems: Sequence[Problem], task, tokenizer, rows: int, round_: int, policy_id: str = "shared", agent_id: str = "solver", temperature: float = 1.0
) -> pa.Table:
    """`rows` rows cycling over `problems`: prompt = the Solver's plain context, completion = the
    reference answer. Sampling logprobs are 0 (the rows were not sampled; the "rs" loss does not
    read them, and the importance-weighted loss must not be used on this view). `temperature` is
    the one the rows are trained at (the run's, like the expert-iteration rows it stands in for)."""
    from pipeline.models.sft import encode_messages_fast

    if not problems:
        raise ValueError("ground_truth_view needs at least one problem")
    chosen = [problems[i % len(problems)] for i in range(rows)]
    pairs = encode_messages_fast(tokenizer, [(task.solver_messages(p), p.answer) for p in chosen])
    table = pa.table(
        {
            "step_id": [f"r{round_}-gt-{p.uid}-{i}" for i, p in enumerate(chosen)],
            "policy_id": [policy_id] * rows,
            "agent_id": [agent_id] * rows,
            "strategy": ["ground_truth"] * rows,
            "train_prompt_ids": [prompt for prompt, _ in pairs],
            "completion_ids": [completion for _, completion in pairs],
            "sampling_logprobs": [[0.0] * len(completion) for _, completion in pairs],
            "advantage": [1.0] * rows,
            "sample_weight": [1.0] * rows,
            "reward": [1.0] * rows,
            "context_swapped": [False] * rows,
            "round": [round_] * rows,
            "turn": [0] * rows,
            "temperature": [float(temperature)] * rows,
        },
        schema=TRAINING_VIEW.schema,
    )
    return validate(table, "training_view")
