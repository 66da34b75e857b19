"""Search strategies (the expert-iteration plan, docs/ALGORITHMS.md#search-strategies): how the sampling context is built, and how the training context
is rebuilt from it.

Each strategy is a frozen record with a `strategy_id` (written to the `strategy` column) and two
pure functions over chat messages:

- `augment(messages, problem)`: the sampling context of a call of an agent the workflow shows
  hints to (`Workflow.hinted_agents`), from the plain one;
- `training_messages(sampling_messages, turn, agent_id)`: the context the completion is trained
  under (the context swap). Completion tokens and their logprobs are never touched here.

and `trainable(turn, agent_id)`: whether rows of that turn enter the training view at all.

Strategies:
- `iid`: sampling context = training context (on-policy, ratio 1).
- `prompt_aug`: a hint is shown while sampling (a system message starting with `HINT_PREFIX`)
  and dropped for training.
- `feedback`: problem -> attempt1 -> feedback -> attempt2; attempt2 is trained under the opening
  only (`train_context="problem"`: the first-turn context with its worked examples and the
  problem) or the opening + attempt1 (`"attempt"`, feedback dropped);
  attempt1 rows are trained as plain iid rows (`first_attempt="iid"`) or not at all ("skip").
- `tree`: AT-GRPO tree-structured best-of-N sampling; contexts are kept (identity).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Literal, Sequence

from pipeline.errors import ConfigError, DataError
from pipeline.types import Message, Problem

__all__ = [
    "HINT_PREFIX",
    "Strategy",
    "IID",
    "PromptAug",
    "Feedback",
    "Tree",
    "make_strategy",
    "split_opening",
    "STRATEGY_IDS",
]

HINT_PREFIX = "Hint: "
"""Marks the augmentation message of `prompt_aug`; the training transform drops exactly these."""

DEFAULT_FEEDBACK_AGENT = "solver"
"""The default agent of the feedback strategy (the math workflow's Solver)."""


def _copy(messages: Sequence[Message]) -> list[Message]:
    return [Message(role=m["role"], content=m["content"]) for m in messages]


def split_opening(messages: Sequence[Message], turn: int) -> tuple[list[Message], list[Message]]:
    """Split an agent's context at turn `turn` into its opening (the first-turn context: system
    text, worked examples as earlier chat turns, the problem) and what came after it: one
    (assistant attempt, user reply) pair per earlier turn.

    The cut is counted from the end, never found by searching for "the first user message": a
    few-shot opening holds several user turns before the problem's own."""
    msgs = list(messages)
    cut = len(msgs) - 2 * int(turn)
    later = msgs[cut:] if cut >= 1 else msgs
    expected = ["assistant", "user"] * int(turn)
    if cut < 1 or [m["role"] for m in later] != expected:
        roles = [m["role"] for m in msgs]
        raise DataError(
            f"a turn-{turn} context must be the opening followed by {turn} (assistant, user) pair(s); "
            f"its roles are {roles}"
        )
    return msgs[:cut], msgs[cut:]


@dataclass(frozen=True)
class Strategy:
    """Base: the identity strategy. Subclasses override what differs."""

    group_size: int = 4
    """Samples per problem (the K of a group) drawn under this strategy."""

    strategy_id: ClassVar[str] = "iid"
    tree: ClassVar[bool] = False
    """True for the strategy the rollout loop runs as tree-structured best-of-N sampling."""

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ConfigError(f"{self.strategy_id}.group_size must be >= 1, got {self.group_size}")

    def augment(self, messages: Sequence[Message], problem: Problem) -> list[Message]:
        """The sampling context of a hinted agent's call (`Workflow.hinted_agents`), built
        from the plain context the environment gave."""
        return _copy(messages)

    def training_messages(self, sampling_messages: Sequence[Message], turn: int, agent_id: str) -> list[Message]:
        """The context a completion sampled under `sampling_messages` is trained under."""
        return _copy(sampling_messages)

    def trainable(self, turn: int, agent_id: str) -> bool:
        return True


@dataclass(frozen=True)
class IID(Strategy):
    strategy_id: ClassVar[str] = "iid"


@dataclass(frozen=True)
class PromptAug(Strategy):
    """Sample with a hint, train without it."""

    strategy_id: ClassVar[str] = "prompt_aug"

    def augment(self, messages: Sequence[Message], problem: Problem) -> list[Message]:
        out = _copy(messages)
        if not problem.hint:
            return out
        hint = Message(role="system", content=HINT_PREFIX + problem.hint)
        first_user = next((i for i, m in enumerate(out) if m["role"] == "user"), len(out))
        return out[:first_user] + [hint] + out[first_user:]

    def training_messages(self, sampling_messages: Sequence[Message], turn: int, agent_id: str) -> list[Message]:
        return [m for m in _copy(sampling_messages) if not (m["role"] == "system" and m["content"].startswith(HINT_PREFIX))]


@dataclass(frozen=True)
class Feedback(Strategy):
    """Two-turn feedback: only the feedback agent's (`agent_id`, the Solver by default) second
    attempt is context-swapped."""

    strategy_id: ClassVar[str] = "feedback"
    train_context: Literal["problem", "attempt"] = "problem"
    """Training context of attempt2: the problem only, or problem + attempt1 (feedback dropped)."""
    first_attempt: Literal["iid", "skip"] = "iid"
    """Attempt1 rows: trained as iid rows of their own, or not trained (weight 0)."""
    agent_id: str = DEFAULT_FEEDBACK_AGENT
    """The agent that gets the feedback and whose second attempt is context-swapped (a run sets
    its workflow's `feedback_agent`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train_context not in ("problem", "attempt"):
            raise ConfigError(f"feedback.train_context must be 'problem' or 'attempt', got {self.train_context!r}")
        if self.first_attempt not in ("iid", "skip"):
            raise ConfigError(f"feedback.first_attempt must be 'iid' or 'skip', got {self.first_attempt!r}")

    def training_messages(self, sampling_messages: Sequence[Message], turn: int, agent_id: str) -> list[Message]:
        msgs = _copy(sampling_messages)
        if turn == 0 or agent_id != self.agent_id:
            return msgs
        opening, later = split_opening(msgs, turn)
        if self.train_context == "problem":
            return opening
        # the opening and the agent's own attempts; the feedback replies are dropped
        return opening + [m for m in later if m["role"] == "assistant"]

    def trainable(self, turn: int, agent_id: str) -> bool:
        if agent_id == self.agent_id and turn == 0:
            return self.first_attempt == "iid"
        return True


@dataclass(frozen=True)
class Tree(Strategy):
    """AT-GRPO tree-structured best-of-N: `group_size` candidates per node, the best continues."""

    strategy_id: ClassVar[str] = "tree"
    tree: ClassVar[bool] = True
    greedy: bool = True
    """Select the highest-reward candidate (else candidate 0, as AT-GRPO's `if_greedy=False`)."""


STRATEGY_IDS = {cls.strategy_id: cls for cls in (IID, PromptAug, Feedback, Tree)}


def make_strategy(strategy_id: str, **options) -> Strategy:
    """Build a strategy by id, e.g. `make_strategy("feedback", group_size=4, train_context="attempt")`."""
    if strategy_id not in STRATEGY_IDS:
        raise ConfigError(f"unknown strategy {strategy_id!r}; choose from {sorted(STRATEGY_IDS)}")
    cls = STRATEGY_IDS[strategy_id]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"strategy {strategy_id!r} takes no option(s) {unknown}; its options: {sorted(known)}")
    return cls(**options)
