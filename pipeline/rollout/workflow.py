"""The workflow contract: one Python object describes a team and its environment.

A `Workflow` names its agents (any number, any ids, each with a policy id), draws problems, and
makes an `Env` for one problem: the environment's state for one episode. The rollout engine
(`pipeline.rollout.loop.run_rollouts`) drives every workflow the same way:

    env = workflow.reset(problem, strategy)
    for turn in range(max_turns):
        for agent_id in workflow.turn_order:
            messages = env.observe(agent_id)          # what the agent sees, as chat messages
            text = <sampled from the agent's policy>  # one `steps` row per call
            result = env.step(agent_id, text)         # local reward, done, verdict
            if result.done: stop
    team reward = env.team_reward()                   # the global reward of every row (a
                                                      # competitive game: one per side, each
                                                      # row its own agent's)

Every agent call is one `steps` row with its tokens and logprobs; the search strategies apply
to any workflow:
- `iid`: `group_size` independent episodes per problem;
- `prompt_aug`: the problem's hint is shown to the agents in `workflow.hinted_agents` (a system
  message, `pipeline.strategies.PromptAug.augment`) and dropped from their training context;
- `feedback`: the workflow's environment gives privileged feedback after the first attempt of
  `workflow.feedback_agent` (workflows that support it say so with `supports_feedback`); that
  agent's second-turn context must be its opening + (attempt, feedback), the shape the training
  transform cuts (`pipeline.strategies.split_opening`);
- `tree` (AT-GRPO): at each agent step N candidates are sampled from one state, each steps its
  own `env.copy()`, the best by the mixed reward (alpha * team reward after the step + local)
  is selected and its state becomes the state of every branch.

User code is hostile input: `observe`, `step`, `team_reward`, `copy` and `feedback` run guarded.
A call that raises, hangs past the reward timeout or returns nonsense (a reward that is not a
finite number, messages that are not chat messages) ends that episode: its row gets a null
reward and `reward_error` names what went wrong, and the round goes on. A workflow that breaks
the contract where it can be checked before sampling (no agents, repeated ids, a turn order
naming an unknown agent, a strategy it does not support) is a one-line `ConfigError` naming the
workflow (`check_workflow`).

The budget-matched baselines (`pipeline.rollout.budget_matched`) ask a workflow four more things, each
with a default: the workflow they score (`scored_as_a_team`: itself, or a competitive game's variant
with one team reward per episode), its single agent (`single_agent`: ONE agent doing the job; by
default `SoloWorkflow`, the first agent of the turn order alone taking every seat, which is the
team's protocol by one agent, `ProtocolWorkflow`, the arm of its own), whether and how its answers compare (`answer_key`; by default
they do not, and there is no majority vote) and what an agent sees when it answers again
(`refine_messages`).
"""

from __future__ import annotations

import copy as _copy
from dataclasses import replace
from typing import Any, ClassVar, Mapping

from pipeline.rollout.agent import SHARED_POLICY, Agent
from pipeline.errors import ConfigError
from pipeline.types import Problem
from pipeline.rollout.contract import Env, StepResult, check_messages, check_workflow, finite_reward

# Env, StepResult and the checks live in .contract, below the rollout engine (which imports them);
# they are re-exported here, where the contract is described.
__all__ = ["StepResult", "Env", "Workflow", "SoloWorkflow", "ProtocolWorkflow", "SoloEnv", "REFINE_PROMPT", "check_workflow", "check_messages", "finite_reward", "with_policies"]

REFINE_PROMPT = "Check your answer above and answer again."
"""What the self-refine baseline says after an agent's previous attempt (`Workflow.refine_messages`)."""


class Workflow:
    """A team and its environment. Subclass it and set `name` and `agents`; implement
    `problems` and `reset`. Everything else has a default."""

    name: ClassVar[str] = ""
    """Short name, shown by `maxit run` and written to the run's record."""
    agents: tuple[Agent, ...] = ()
    """The team: one `Agent(agent_id, policy_id)` per member (equal policy ids share weights)."""
    max_turns: int = 1
    """Turns at most per episode (every agent of `turn_order` acts once per turn)."""
    supports_feedback: ClassVar[bool] = False
    """Whether `reset(problem, Feedback(...))` gives an environment that runs the two-turn
    feedback strategy (privileged feedback after `feedback_agent`'s first attempt)."""
    run_defaults: ClassVar[Mapping[str, Any]] = {}
    """Run settings this workflow runs with where the command line leaves them unset, by setting
    name (`maxit run`'s flags without the dashes: `{"problems": 256}`): the budget its environment
    needs to learn within a run's rounds. `maxit run` and `maxit rollout` apply them below any
    flag given (`pipeline.run.settings.settings_from_args`) and say so (the stage commands take no
    workflow); `Settings(...)`, `RunConfig(...)` and the Dagster launchpad's fields take the
    values they are given. A ClassVar of a `Workflow` class (a factory function has none). A
    setting that an algorithm or a loss presets (the loss, the strategies, the reward mix...) is
    the algorithm's and cannot be defaulted here."""

    # -- what a subclass provides ---------------------------------------------------------
    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` ("train" or "heldout"; the two never share a problem)."""
        raise NotImplementedError

    def reset(self, problem: Problem, strategy) -> Env:
        """A fresh environment for one episode of `problem` under `strategy`
        (a `pipeline.strategies.Strategy`; most environments ignore it)."""
        raise NotImplementedError

    # -- defaults -------------------------------------------------------------------------
    @property
    def turn_order(self) -> tuple[str, ...]:
        """Agent ids in the order they act within one turn (default: `agents` order)."""
        return tuple(a.agent_id for a in self.agents)

    @property
    def hinted_agents(self) -> tuple[str, ...]:
        """Agents shown the problem's hint under `prompt_aug` (default: the first to act)."""
        return self.turn_order[:1]

    @property
    def feedback_agent(self) -> str:
        """The agent whose second attempt the feedback strategy trains context-swapped."""
        return self.turn_order[0]

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        """Completion budget of the agent's calls (kind "rollout" or "eval"); None = the run's."""
        return None

    def default_model(self):
        """The embedded model a run starts from when no model directory is given (a local HF
        model directory), or None when the workflow has none (then `--model` is required)."""
        return None

    def evaluate(self, samplers, tokenizers, config, round_: int):
        """The `evaluation` rows of one round (default: `pipeline.rollout.evaluation.evaluate_workflow`,
        the team on held-out problems, team success and each agent's mean local reward)."""
        from pipeline.rollout.evaluation import evaluate_workflow

        return evaluate_workflow(self, samplers, tokenizers, config, round_)

    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("team", "success", "success"),
        ("team", "success_greedy", "greedy"),
    )
    """(agent_id, metric, column) of the evaluation metrics the round table shows."""
    judged_metrics: ClassVar[tuple[tuple[str, str], ...] | None] = None
    """The (agent_id, metric) pairs of `table_metrics` that say how good a round is, each higher
    is better: what `--start-from best` picks a round by and what the round table's regression
    warning judges. None: every pair of `table_metrics` (`judged`)."""

    def judged(self) -> tuple[tuple[str, str], ...]:
        """`judged_metrics`, or every (agent_id, metric) pair of `table_metrics` when it is None."""
        if self.judged_metrics is not None:
            return self.judged_metrics
        return tuple((a, m) for a, m, _ in self.table_metrics)

    # -- the budget-matched baselines (`pipeline.rollout.budget_matched`) -----------------------
    def scored_as_a_team(self) -> "Workflow":
        """The workflow as the baselines (and a workflow's own evaluation, where it asks) score
        it, with one team reward per episode: itself by default. A competitive game whose
        training rows carry one reward per side (`Env.team_reward`'s mapping) returns its variant
        with a team reward that reads the same for both sides (the games: a legal finish, the
        joint deal value)."""
        return self

    def single_agent(self) -> "Workflow | None":
        """The team's single-agent variant: ONE agent doing the team's job alone (not the team's
        protocol played by one agent: that is `ProtocolWorkflow`, a baseline arm of its own),
        which the baselines play at one call and at the team's number of model calls. A workflow
        whose job one agent can do in one of its seats says how (math: the Solver alone; grid:
        one agent committing a move each turn; tool_plan: one agent answering). Default, for a
        workflow that does not say: the first agent of `turn_order` alone, playing every seat of
        every turn (`SoloWorkflow`: the environment sees the team's schedule, each call made by
        that one agent), which is the protocol. None: the workflow has no single agent (the
        baselines' rows then say so)."""
        return SoloWorkflow(self)

    def answer_key(self, agent_id: str, text: str) -> str | None:
        """What `agent_id`'s call `text` answered, as a key that is equal for equal answers (the
        best-of-k majority vote counts keys), or None when the text holds no answer. Default:
        answers do not compare (`compares_answers` False: no vote baseline)."""
        return None

    compares_answers: ClassVar[bool] = False
    """Whether `answer_key` reads answers that compare (the best-of-k vote applies)."""

    def refine_messages(self, agent_id: str, messages: list, attempt: str) -> list | None:
        """What `agent_id` sees when it answers again in the self-refine baseline: the messages of
        its call, its previous attempt as an assistant turn and `REFINE_PROMPT`. None: the
        workflow has no self-refine loop."""
        return [*messages, {"role": "assistant", "content": attempt}, {"role": "user", "content": REFINE_PROMPT}]

    @property
    def policy_ids(self) -> tuple[str, ...]:
        """The team's policies, in the order of their first agent."""
        return tuple(dict.fromkeys(a.policy_id for a in self.agents))

    def describe(self) -> str:
        """One line: the workflow's name and its agents with their policies."""
        team = ", ".join(f"{a.agent_id}@{a.policy_id}" for a in self.agents)
        return f"{self.name or type(self).__name__} ({team})"


def with_policies(workflow: Workflow, shared: bool) -> Workflow:
    """`workflow` with every agent on the one policy "shared" (`shared=True`) or each on its own
    policy named after it; a workflow whose agents already name other policies keeps them."""
    ids = {a.policy_id for a in workflow.agents}
    if ids - {SHARED_POLICY} and ids != {a.agent_id for a in workflow.agents}:
        return workflow
    agents = tuple(replace(a, policy_id=SHARED_POLICY if shared else a.agent_id) for a in workflow.agents)
    if agents == tuple(workflow.agents):
        return workflow
    clone = _copy.copy(workflow)
    try:
        clone.agents = agents
    except AttributeError as err:  # a frozen dataclass workflow
        raise ConfigError(f"workflow {workflow.name!r}: cannot set its agents' policies ({err})") from None
    return clone


class SoloEnv(Env):
    """The team's environment played by one agent: each call is made in the next seat of `seats`
    (the team agents whose turns the one agent takes, in order), and the seats of `echo` are then
    stepped with the same text without a call of their own (e.g. a mover committing the planner's
    letter). The episode ends when any of these steps ends it."""

    def __init__(self, env: Env, seats: tuple[str, ...], echo: tuple[str, ...] = ()) -> None:
        self.env, self.seats, self.echo, self.seat = env, seats, echo, 0

    def copy(self) -> "SoloEnv":
        out = SoloEnv(self.env.copy(), self.seats, self.echo)
        out.seat = self.seat
        return out

    def observe(self, agent_id: str):
        return self.env.observe(self.seats[self.seat])

    def step(self, agent_id: str, text: str) -> StepResult:
        result = self.env.step(self.seats[self.seat], text)
        self.seat = (self.seat + 1) % len(self.seats)
        for seat in self.echo if not result.done else ():
            after = self.env.step(seat, text)
            result = StepResult(result.reward, after.done, result.verdict, result.error or after.error)
            if after.done:
                break
        return result

    def team_reward(self):
        return self.env.team_reward()


class SoloWorkflow(Workflow):
    """`team` played by one agent (`Workflow.single_agent`): the agent `agent_id` (default: the
    first of the team's `turn_order`) takes every seat of `seats` (default: the whole turn order)
    in turn, one call per seat, and `echo` seats are stepped with its text (`SoloEnv`). Problems,
    budgets, the embedded model and the answers' keys are the team's."""

    supports_feedback: ClassVar[bool] = False

    def __init__(self, team: Workflow, agent_id: str | None = None, seats: tuple[str, ...] | None = None, echo: tuple[str, ...] = ()) -> None:
        self.team = team
        agent_id = agent_id or team.turn_order[0]
        self.agents = tuple(a for a in team.agents if a.agent_id == agent_id)
        if not self.agents:
            raise ConfigError(f"workflow {team.name or type(team).__name__!r} has no agent {agent_id!r} to play alone")
        self.seats = tuple(seats) if seats else team.turn_order
        self.echo = tuple(echo)
        self.name = f"{team.name or type(team).__name__}-single"

    @property
    def max_turns(self) -> int:
        return self.team.max_turns * len(self.seats)

    def problems(self, split: str, n: int, seed: int):
        return self.team.problems(split, n, seed)

    def reset(self, problem: Problem, strategy) -> SoloEnv:
        return SoloEnv(self.team.reset(problem, strategy), self.seats, self.echo)

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        budgets = [b for seat in self.seats if (b := self.team.max_tokens(seat, kind))]
        return max(budgets) if budgets else None

    def default_model(self):
        return self.team.default_model()

    @property
    def compares_answers(self) -> bool:  # type: ignore[override]
        return self.team.compares_answers

    def answer_key(self, agent_id: str, text: str) -> str | None:
        return self.team.answer_key(self.seats[0], text)

    def refine_messages(self, agent_id: str, messages: list, attempt: str) -> list | None:
        return self.team.refine_messages(self.seats[0], messages, attempt)


class ProtocolWorkflow(SoloWorkflow):
    """The team's protocol played by ONE agent (the baseline arm that isolates the protocol from
    the team): the first agent of the team's `turn_order` takes every seat of every turn, one call
    per seat, so the environment, its tools and their outputs, the turns and the calls are the
    team's; only the agents are one (one agent id, one policy, trained on all of the protocol's
    rows). What differs from the team beyond that, by the contract's shape: each call's budget is
    the largest of the seats' (`max_tokens` is asked per agent, not per seat), the hint of
    `prompt_aug` is shown at every seat (the team shows it to its `hinted_agents`), and the
    feedback strategy does not run (it is aimed at one of the team's agents)."""

    def __init__(self, team: Workflow) -> None:
        super().__init__(team)
        self.name = f"{team.name or type(team).__name__}-protocol"
