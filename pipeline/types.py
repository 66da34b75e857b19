"""Typed records that cross stage boundaries (tasks -> agents/strategies -> engines -> rollouts).

Tables between stages are Arrow (see `schemas/`); these are the in-memory records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, Sequence, TypedDict, runtime_checkable

__all__ = ["Message", "Problem", "Sample", "Sampler", "GenerateCall", "generate_calls"]


class Message(TypedDict):
    """One chat message, as chat templates and the `sampling_messages` column hold it."""

    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class Problem:
    """One problem of a task."""

    uid: str
    """Stable id of the problem; the K samples of a group share it."""
    question: str
    """The question as the Solver sees it (no hint)."""
    answer: str
    """The reference answer, in the form the task's reward compares against."""
    split: str = "train"
    """"train" or "heldout"; a task guarantees the two never share a problem."""
    hint: str | None = None
    """Extra help for the prompt-augmentation strategy (shown while sampling, dropped for training)."""
    meta: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """Free key/value pairs (task name, difficulty...)."""


@dataclass(frozen=True)
class Sample:
    """One sampled completion, exactly as the engine produced it."""

    token_ids: list[int]
    """Completion token ids, verbatim from the engine (never re-tokenized)."""
    logprobs: list[float]
    """log q(token) of each chosen token under the distribution actually sampled
    (temperature applied, no top-k/top-p unless configured); same length as token_ids."""
    text: str
    """Decoded completion (for reading and scoring only)."""
    finish_reason: str
    """"stop" (end-of-sequence) or "length" (max_tokens reached)."""


@runtime_checkable
class Sampler(Protocol):
    """A rollout engine. Implementations: `pipeline.engines.vllm.VLLMSampler`,
    `pipeline.engines.hf.HFSampler`; make one with `pipeline.engines.make_sampler`. An engine may
    also have `generate_calls(calls)`, several calls as one batch (see `generate_calls` below)."""

    engine: str
    """"vllm" or "hf"; written to the `engine` column."""
    model_dir: Path
    """The checkpoint currently loaded."""

    @property
    def model_version(self) -> str:
        """A short id of the loaded weights (written to `model_version`)."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        n: int,
        temperature: float,
        max_tokens: int,
        seed: int | Sequence[int],
    ) -> list[list[Sample]]:
        """n samples for each prompt, in prompt order; result[i][j] is sample j of prompt i.
        `seed` is one int for the call, or one int per prompt (a prompt's samples then do not
        depend on the other prompts of the call)."""
        ...

    def load_checkpoint(self, model_dir: str | Path) -> None:
        """Swap in new weights (between rounds) without rebuilding the whole engine where possible."""
        ...

    def close(self) -> None:
        ...


class GenerateCall(NamedTuple):
    """The arguments of one `Sampler.generate` call."""

    prompt_ids: Sequence[Sequence[int]]
    n: int
    temperature: float
    max_tokens: int
    seed: int | Sequence[int]


def generate_calls(sampler: Sampler, calls: Sequence[GenerateCall]) -> list[list[list[Sample]]]:
    """The results of several independent `generate` calls, in call order, each exactly what
    `sampler.generate(*call)` returns.

    A sampler with its own `generate_calls(calls)` (vLLM) runs them as one batch: decoding a few
    sequences at a time leaves most of a CPU's matmul rate unused, so calls that do not wait for
    each other (a step's requests of different counts; the evaluation's sampled, greedy and hinted
    passes) are cheaper together. Any other sampler runs them one after the other."""
    calls = [GenerateCall(*c) for c in calls]
    together = getattr(sampler, "generate_calls", None)
    if callable(together) and len(calls) > 1:
        out = together(calls)
        if len(out) != len(calls):
            raise RuntimeError(f"{type(sampler).__name__}.generate_calls returned {len(out)} results for {len(calls)} calls")
        return out
    return [sampler.generate(c.prompt_ids, c.n, c.temperature, c.max_tokens, c.seed) for c in calls]
