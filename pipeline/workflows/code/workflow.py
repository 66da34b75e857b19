"""`CodeWorkflow`: the Coder/Tester team on generated, HumanEval or task-file problems (the game
and its rewards: the package's docstring)."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from pipeline.errors import ConfigError
from pipeline.rollout.agent import Agent
from pipeline.rollout.workflow import Workflow
from pipeline.types import Problem
from pipeline.workflows.code.env import CHECK_AGAIN, CODER, TESTER, CodeEnv, Runs, candidate_source, extract_code, parse_tester_tests, tests_key
from pipeline.workflows.code.problems import CodeSpec, ast_mutants, generate_problems, humaneval_problems, read_task_file, spec_of

__all__ = ["CodeWorkflow", "DATASETS", "TEAMS"]

DATASETS = ("generated", "humaneval")


TEAMS = {"coder_tester": (CODER, TESTER), "coder": (CODER,)}
"""The `team` option: the agents (in turn order) of each team the workflow plays."""


def _default_agents() -> tuple[Agent, ...]:
    return (Agent(CODER), Agent(TESTER))


@dataclass
class CodeWorkflow(Workflow):
    """A Coder and a Tester (see `pipeline.workflows.code`). Options (`--workflow-options`):
    `dataset` (generated | humaneval), `task_file` (JSONL; instead of `dataset`),
    `max_loop_num` (turns, default 2), `heldout_fraction` (1 with a fixed set: all held out, to
    evaluate a model on every problem), `max_tests` (Tester tests kept),
    `mutants` (wrong programs a Tester's tests are scored against), `sandbox_timeout` (seconds
    per program), `sandbox_memory_mb`, `workers` (programs run at once), `coder_tokens`,
    `tester_tokens` (completion budgets), `allow_unisolated_network`, `team` (coder_tester, the
    default; or coder: the Coder alone, a team of one, one call per episode rewarded by the hidden
    tests' pass rate: the baseline the Tester has to beat)."""

    dataset: str = "generated"
    task_file: str | None = None
    max_loop_num: int = 2
    heldout_fraction: float = 0.2
    max_tests: int = 8
    mutants: int = 3
    sandbox_timeout: float = 2.0
    sandbox_memory_mb: int = 256
    workers: int = 8
    coder_tokens: int = 256
    tester_tokens: int = 192
    allow_unisolated_network: bool = False
    team: str = "coder_tester"
    agents: tuple[Agent, ...] = field(default_factory=_default_agents)

    name: ClassVar[str] = "code"
    supports_feedback: ClassVar[bool] = False
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("team", "success", "success"),
        ("team", "success_greedy", "greedy"),
        ("team", "solved", "solved"),
        (CODER, "reward", "coder_reward"),
        (TESTER, "reward", "tester_reward"),
    )

    def __post_init__(self) -> None:
        def bad(what: str) -> ConfigError:
            return ConfigError(f"workflow 'code': {what}")

        for name, low in (("max_loop_num", 1), ("max_tests", 1), ("mutants", 0), ("sandbox_memory_mb", 64), ("workers", 1),
                          ("coder_tokens", 1), ("tester_tokens", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise bad(f"{name} must be an integer >= {low}, got {v!r}")
        if isinstance(self.sandbox_timeout, bool) or not isinstance(self.sandbox_timeout, (int, float)) or not 0 < self.sandbox_timeout <= 5:
            raise bad(f"sandbox_timeout must be seconds in (0, 5] (a step runs its programs at once, within the 10 s reward timeout), got {self.sandbox_timeout!r}")
        if not (isinstance(self.heldout_fraction, (int, float)) and 0 < self.heldout_fraction <= 1):
            raise bad(f"heldout_fraction must be in (0, 1], got {self.heldout_fraction!r}")
        if self.heldout_fraction == 1 and self.dataset == "generated" and self.task_file is None:
            raise bad("heldout_fraction=1 (every problem held out, for an evaluation-only pass) needs a fixed set: dataset=humaneval or a task_file")
        if self.dataset not in DATASETS:
            raise bad(f"dataset must be one of {list(DATASETS)}, got {self.dataset!r}")
        if self.task_file is not None and self.dataset != "generated":
            raise bad(f"give either task_file or dataset={self.dataset}, not both")
        if not isinstance(self.allow_unisolated_network, bool):
            raise bad(f"allow_unisolated_network must be true or false, got {self.allow_unisolated_network!r}")
        if self.team not in TEAMS:
            raise bad(f"team must be one of {list(TEAMS)}, got {self.team!r}")
        self.agents = tuple(self.agents)
        if self.team == "coder" and self.agents == _default_agents():
            self.agents = (Agent(CODER),)
        ids = sorted(a.agent_id for a in self.agents)
        if ids != sorted(TEAMS[self.team]):
            raise bad(f"team {self.team} needs the agents {list(TEAMS[self.team])}, got {ids}")
        if self.team == "coder":
            self._coder_alone_columns()
        self._check_isolation()
        self._cache: dict[str, Runs] = {}
        self.sandbox_seconds = 0.0
        self._pool: dict[str, list[Problem]] | None = None
        if self.task_file is not None:
            rows = read_task_file(self.task_file, self.heldout_fraction, self.sandbox_settings())
        elif self.dataset == "humaneval":
            rows = humaneval_problems(self.heldout_fraction)
        else:
            rows = None
        if rows is not None:
            self._pool = {"train": [p for p in rows if p.split == "train"], "heldout": [p for p in rows if p.split == "heldout"]}

    def _coder_alone_columns(self) -> None:
        """No Tester columns in the round table."""
        self.table_metrics = tuple(m for m in type(self).table_metrics if m[0] != TESTER)

    def _check_isolation(self) -> None:
        """The sandbox refuses to run code without network isolation: say so now, not mid-round."""
        from pipeline import sandbox

        if self.allow_unisolated_network or sandbox.available_isolation() != "none":
            return
        report = sandbox.isolation_report()
        raise ConfigError(f"workflow 'code': the sandbox that runs the agents' code has no network isolation here "
                          f"({report['bwrap']}; {report['netns']}); install bubblewrap (apt-get install bubblewrap) "
                          f"or pass --workflow-options allow_unisolated_network=true")

    def single_agent(self) -> "CodeWorkflow":
        """The Coder alone (`team=coder`: one call per episode, rewarded by the hidden tests) on the
        same problems, sandbox and budgets, with the team's Coder (its policy): the default
        (`SoloWorkflow`) would have the Coder write the Tester's tests as well. A copy of this
        workflow, whose settings were checked and whose problems were read when it was made, so
        neither is done again; its own cache of test runs."""
        solo = copy.copy(self)
        solo.team = "coder"
        solo.agents = tuple(a for a in self.agents if a.agent_id == CODER)
        solo._coder_alone_columns()
        solo._cache, solo.sandbox_seconds = {}, 0.0
        return solo

    def refine_messages(self, agent_id: str, messages: list, attempt: str) -> list:
        """The self-refine baseline's next call: the Coder's previous attempt, then the words the
        team's Coder gets when it has no failing test to answer (`CHECK_AGAIN`: the whole function
        again, in a code block), so the loop is the team's second turn without the Tester; the
        generic "answer again" does not say that the last attempt is scored as code."""
        return [*messages, {"role": "assistant", "content": attempt}, {"role": "user", "content": CHECK_AGAIN}]

    # -- the contract -----------------------------------------------------------------------
    @property
    def max_turns(self) -> int:
        return 1 if self.team == "coder" else self.max_loop_num

    @property
    def turn_order(self) -> tuple[str, ...]:
        return TEAMS[self.team]

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        if split not in ("train", "heldout"):
            raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
        if self._pool is not None:
            pool = list(self._pool[split])
            random.Random(f"code-pool:{split}:{seed}").shuffle(pool)
            return pool[:n]
        return generate_problems(split, n, seed, self.heldout_fraction)

    def reset(self, problem: Problem, strategy) -> CodeEnv:
        spec = spec_of(problem)
        runs = self._runs(problem.uid, spec)
        self.killable(runs)  # the problem's wrong programs, found once (a few programs)
        return CodeEnv(self, problem, spec, runs)

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        return self.coder_tokens if agent_id == CODER else self.tester_tokens

    # -- running programs -------------------------------------------------------------------
    def sandbox_settings(self) -> dict:
        return {"timeout": float(self.sandbox_timeout), "memory_mb": self.sandbox_memory_mb, "allow_unisolated_network": self.allow_unisolated_network}

    def execute(self, items: Sequence[tuple[str, object]]) -> list:
        """`run_tests` on each (program, tests), `workers` at a time; the wall seconds the caller
        waited are added to `sandbox_seconds` (the round's `sandbox` timing)."""
        import time

        from pipeline.sandbox import run_tests_many

        t0 = time.perf_counter()
        try:
            return run_tests_many(items, workers=min(self.workers, len(items)), **self.sandbox_settings())
        finally:
            self.sandbox_seconds += time.perf_counter() - t0

    def _runs(self, uid: str, spec: CodeSpec) -> Runs:
        runs = self._cache.get(uid)
        if runs is None or runs.spec != spec:
            while len(self._cache) >= 4096:  # the oldest problem's results go first
                try:
                    del self._cache[next(iter(self._cache))]
                except (KeyError, StopIteration, RuntimeError):
                    break
            runs = self._cache[uid] = Runs(self, spec)
        return runs

    def killable(self, runs: Runs) -> tuple[str, ...]:
        """The problem's wrong programs: its given mutants, else AST mutants of the reference,
        that fail at least one hidden test (up to `mutants` of them)."""
        if runs.killable is None:
            spec = runs.spec
            candidates = list(spec.mutants) or ast_mutants(spec.reference, spec.entry_point, 2 * self.mutants)
            candidates = candidates[: 2 * self.mutants] if self.mutants else []
            results = runs.run([(m, None) for m in candidates]) if candidates else []
            runs.killable = tuple(m for m, r in zip(candidates, results) if r.rate < 1.0)[: self.mutants]
        return runs.killable

    # -- evaluation -------------------------------------------------------------------------
    def metrics(self, steps) -> list[tuple[str, str, float, int]]:
        """Extra evaluation rows: team `solved` (episodes whose latest code passes every hidden
        test), coder `harness_failure` (calls whose code hung, crashed or exited before its
        hidden tests answered), tester `validity` and `catch_rate` (means over its calls with
        tests, from the cached results)."""
        import polars as pl

        out: list[tuple[str, str, float, int]] = []
        episodes = steps.group_by("traj_uid").agg(pl.col("global_reward").first())
        if episodes.height:
            solved = sum(v is not None and v >= 1.0 for v in episodes["global_reward"].to_list())
            out.append(("team", "solved", solved / episodes.height, episodes.height))
        failures, calls = 0, 0
        validity, catch = [], []
        for uid, agent_id, text in steps.select("uid", "agent_id", "completion_text").iter_rows():
            runs = self._cache.get(uid)
            if runs is None:
                continue
            if agent_id == CODER:
                res = runs.results.get((candidate_source(runs.spec, extract_code(text, runs.spec.entry_point)), "\x00hidden"))
                if res is not None:
                    calls += 1
                    failures += res.why is not None
            elif agent_id == TESTER:
                scores = runs.tester.get(tests_key(parse_tester_tests(text, runs.spec.entry_point, self.max_tests)))
                if scores is not None:
                    validity.append(scores[0])
                    catch.append(scores[1])
        if calls:
            out.append((CODER, "harness_failure", failures / calls, calls))
        if validity:
            out.append((TESTER, "validity", sum(validity) / len(validity), len(validity)))
            out.append((TESTER, "catch_rate", sum(catch) / len(catch), len(catch)))
        return out
