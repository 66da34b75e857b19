"""A team written as a program of OpenAI API calls, trained as it is: `--workflow program:FILE.py:FUNC`.

    AGENTS = ["proposer", "checker"]              # or @team("proposer", "checker") on FUNC

    def problems(split, n, seed): ...             # or the run's --task-file

    def run(problem, client):                     # client: an openai.OpenAI (AsyncOpenAI for async def)
        a = client.chat.completions.create(model="proposer", messages=[...]).choices[0].message.content
        b = client.chat.completions.create(model="checker", messages=[...]).choices[0].message.content
        return 1.0 if ... else 0.0                # the team reward, or {"proposer": 1.0, "checker": 0.0}

`ProgramWorkflow` plays each episode by calling `FUNC(problem, client)` with a client pointed at
the round's endpoint (`pipeline.rollout.endpoint`), where `model` names an agent: every call is a
`steps` row (the prompt ids the engine saw, the completion ids and logprobs verbatim, the agent,
its turn: the agent's call count within the episode, and the episode's uid, strategy and sample
index, carried by the client's base URL). The program may call any agents in any order, any
number of times; FUNC may be `async def` (its calls may then run concurrently).

Rewards: a number is the team reward, each row's global and local reward; a mapping gives each
agent its own (`{"proposer": 1.0, "checker": 0.0}`: each row's local and global reward is its
agent's), and its key "team", where given, is every row's global reward. The default loss reads
the local reward.

Declared in the program's module (all optional but the agents):
- `AGENTS`: the agent ids (or `pipeline.rollout.agent.Agent` records), or the `team(...)`
  decorator on FUNC;
- `HINTED_AGENTS`: the agents the `prompt_aug` strategy shows the problem's hint to, as a system
  message the endpoint adds (default: the first agent); the training view removes it;
- `problems(split, n, seed)`: `pipeline.types.Problem` records, or dicts with `question`,
  `answer` and optionally `uid` and `hint`; else the run's `--task-file`;
- `MAX_TOKENS`: the completion budget of every call (an int) or of each agent (a mapping);
- `default_model()`: the local model directory a run starts from without `--model-dir`.

Strategies: `iid` and `prompt_aug` run; `tree` (it branches copies of an environment state) and
`feedback` (it needs a verdict and a second attempt) are refused by name (`check_workflow`).

A program is hostile input. Each episode runs in a thread of its own; an exception, a return
value that is not a reward, a refused request (an unknown model, a malformed body, a call after
it returned) or running past `timeout` seconds of its own time (model calls excluded: they wait
on the engine with every other episode's) ends that episode: its rows get a null reward and the
first error in `reward_error`, and the round goes on. A hung thread cannot be stopped in
Python: it is abandoned, and its later calls are refused. An episode that made no call has no
row to carry its error; those are counted in the log.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Mapping, Sequence

from pipeline.errors import ConfigError, DataError
from pipeline.rollout.agent import Agent
from pipeline.rollout.contract import team_value
from pipeline.rollout.endpoint import Endpoint, EpisodeCalls
from pipeline.rollout.rewards import Outcome
from pipeline.rollout.rows import Episode, Row
from pipeline.rollout.workflow import Workflow
from pipeline.workflows.modules import resolve
from pipeline.types import Problem

__all__ = ["ProgramWorkflow", "team", "PREFIX"]

log = logging.getLogger(__name__)

PREFIX = "program:"
"""`--workflow program:FILE.py:FUNC` (or `program:pkg.module:func`) names a program."""

CLIENT_TIMEOUT = 3600.0
"""The client's own per-request timeout, in seconds: a call waits on the engine with every other
episode's, so only the episode's own time (`ProgramWorkflow.timeout`) is held against it."""


def team(*agents: str | Agent, hinted: Sequence[str] | None = None) -> Callable[[Callable], Callable]:
    """Declare a program's agents on its function (instead of the module's `AGENTS`), and
    optionally the agents `prompt_aug` hints (instead of `HINTED_AGENTS`)."""

    def mark(fn: Callable) -> Callable:
        fn.maxit_team = (tuple(agents), None if hinted is None else tuple(hinted))
        return fn

    return mark


class ProgramWorkflow(Workflow):
    """The workflow of a program (see the module doc): `program` is "FILE.py:FUNC" or
    "pkg.module:func". Options: `task_file` (the run's; problems when the module has no
    `problems`), `timeout` (seconds of the program's own time per episode), `request_sampling`
    (let a request's temperature and max_tokens replace the run's), `concurrency` (episodes
    running at once)."""

    supports_feedback = False
    supports_tree = False
    """A program's state is its own Python frame: there is nothing to copy for the tree."""

    def __init__(self, program: str, task_file: str | None = None, timeout: float = 60.0, request_sampling: bool = False, concurrency: int = 32) -> None:
        self.program = program
        self.name = PREFIX + program
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"workflow {self.name!r}: timeout must be a number of seconds > 0, got {timeout!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"workflow {self.name!r}: concurrency must be an integer >= 1, got {concurrency!r}")
        if not isinstance(request_sampling, bool):
            raise ConfigError(f"workflow {self.name!r}: request_sampling must be true or false, got {request_sampling!r}")
        self.timeout, self.request_sampling, self.concurrency = float(timeout), request_sampling, concurrency
        module, self.fn = _load(program)
        self.is_async = inspect.iscoroutinefunction(self.fn)
        declared, hinted = getattr(self.fn, "maxit_team", (getattr(module, "AGENTS", None), getattr(module, "HINTED_AGENTS", None)))
        self.agents = _agents(self.name, declared)
        ids = [a.agent_id for a in self.agents]
        self._hinted = tuple(hinted) if hinted is not None else tuple(ids[:1])
        if not all(isinstance(h, str) for h in self._hinted):
            raise ConfigError(f"workflow {self.name!r}: HINTED_AGENTS must be agent ids, got {list(self._hinted)!r}")
        self._problems = getattr(module, "problems", None)
        self.task_file = task_file
        if not callable(self._problems) and task_file is None:
            raise ConfigError(f"workflow {self.name!r}: define problems(split, n, seed) beside {program.rpartition(':')[2]} or give --task-file")
        self._budget = getattr(module, "MAX_TOKENS", None)
        if not (self._budget is None or isinstance(self._budget, Mapping) or (isinstance(self._budget, int) and not isinstance(self._budget, bool) and self._budget >= 1)):
            raise ConfigError(f"workflow {self.name!r}: MAX_TOKENS must be an integer >= 1 or a mapping agent_id -> integer, got {self._budget!r}")
        self._default_model = getattr(module, "default_model", None)

    # -- the contract ---------------------------------------------------------------------
    @property
    def hinted_agents(self) -> tuple[str, ...]:
        return self._hinted

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        if not callable(self._problems):
            from pipeline.tasks.files import load_task_file

            return load_task_file(self.task_file).problems(split, n, seed)
        try:
            drawn = self._problems(split, n, seed)
        except (ConfigError, DataError):
            raise
        except Exception as err:  # noqa: BLE001 - the program's code may raise anything
            raise DataError(f"workflow {self.name!r}: problems({split!r}, {n}, {seed}) raised {type(err).__name__}: {err}") from None
        return [_problem(self.name, split, i, p) for i, p in enumerate(drawn or ())]

    def reset(self, problem: Problem, strategy):
        raise ConfigError(f"workflow {self.name!r}: a program plays whole episodes (run_episodes); it has no environment to step")

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        if isinstance(self._budget, Mapping):
            return self._budget.get(agent_id)
        return self._budget

    def default_model(self):
        return self._default_model() if callable(self._default_model) else None

    def single_agent(self):
        return None

    def refine_messages(self, agent_id: str, messages: list, attempt: str):
        return None

    # -- the episodes -----------------------------------------------------------------------
    def run_episodes(self, problems: Sequence[Problem], strategies: Sequence, samplers: Mapping, tokenizers: Mapping, config) -> list[Row]:
        """Every episode of every strategy played through one endpoint, which listens for this
        call only; the rows of all of them with their rewards (see the module doc)."""
        from pipeline.rollout.loop import make_episodes

        episodes = make_episodes(problems, strategies, config.round)
        endpoint = Endpoint(self.agents, samplers, tokenizers, config, hinted=self._hinted, request_sampling=self.request_sampling)
        with endpoint:
            returned = self._play_all(endpoint, episodes)
        rows: list[tuple[int, int, Row]] = []
        no_call = []
        for order, calls in enumerate(endpoint.episodes.values()):
            e = calls.episode
            with calls.lock:
                mine = sorted(e.rows, key=lambda r: r.step)
            error = e.error or _reward_error(self, returned.get(calls.key))
            if not mine:
                no_call.append(f"{e.traj_uid}: {error or 'the program made no call'}")
            value = None if error else returned[calls.key][0]
            for row in mine:
                row.global_, row.local = _row_outcomes(value, error, row.agent_id)
                rows.append((row.step, order, row))
        if no_call:
            log.warning("%s: %d of %d episodes have no row (no call recorded); the first, %s", self.name, len(no_call), len(endpoint.episodes), no_call[0])
        failed = [c.episode for c in endpoint.episodes.values() if c.episode.error]
        if failed:
            log.warning("%s: %d of %d episodes failed; the first, %s: %s", self.name, len(failed), len(endpoint.episodes), failed[0].traj_uid, failed[0].error)
        return [row for _, _, row in sorted(rows, key=lambda t: (t[0], t[1]))]

    def _play_all(self, endpoint: Endpoint, episodes: list[Episode]) -> dict[str, tuple[Any, str | None]]:
        """Run the program on every episode, `concurrency` at a time, each in a thread; an
        episode past its own-time budget is failed, closed and abandoned. Returns key ->
        (the program's return value, its error) of the episodes that returned."""
        import httpx

        class SharedPool(httpx.Client):
            """The round's pool: a program's `client.close()` (or `with client:`) closes its
            client's pool, which must not end every other episode's calls."""

            def close(self) -> None:
                pass

            def close_pool(self) -> None:
                super().close()

        # one connection pool for every sync episode's client (a client of its own costs each
        # episode a pool and an SSL context it never uses)
        http = SharedPool(timeout=CLIENT_TIMEOUT, limits=httpx.Limits(max_connections=2 * self.concurrency))
        try:
            return self._run_threads(endpoint, episodes, http)
        finally:
            http.close_pool()

    def _run_threads(self, endpoint: Endpoint, episodes: list[Episode], http) -> dict[str, tuple[Any, str | None]]:
        pending = deque(episodes)
        running: dict[str, tuple[threading.Thread, dict, EpisodeCalls]] = {}
        returned: dict[str, tuple[Any, str | None]] = {}
        done = threading.Event()
        while pending or running:
            while pending and len(running) < self.concurrency:
                calls = endpoint.open_episode(pending.popleft())
                box: dict = {}
                thread = threading.Thread(
                    target=_play, args=(self.fn, self.is_async, calls.episode.problem, endpoint.base_url(calls), http, box, done),
                    daemon=True, name=f"maxit-program-{calls.episode.traj_uid}",
                )
                with calls.lock:
                    calls.started = time.monotonic()
                thread.start()
                running[calls.key] = (thread, box, calls)
            done.wait(0.05)
            done.clear()
            now = time.monotonic()
            for key, (thread, box, calls) in list(running.items()):
                if not thread.is_alive():
                    endpoint.close_episode(calls)
                    returned[key] = (box.get("value"), box.get("error"))
                    del running[key]
                elif calls.own_seconds(now) > self.timeout:
                    endpoint.close_episode(calls)
                    calls.fail(f"the program ran past its timeout ({self.timeout:g} s of its own time, model calls excluded) and was abandoned")
                    del running[key]
        return returned


def _play(fn: Callable, is_async: bool, problem: Problem, base_url: str, http, box: dict, done: threading.Event) -> None:
    """One episode: `fn(problem, client)` with a client of the episode's base URL (a sync one on
    the shared connection pool `http`); its return value or error goes to `box`."""
    import openai

    try:
        if is_async:
            async def go():
                client = openai.AsyncOpenAI(base_url=base_url, api_key="maxit", max_retries=0, timeout=CLIENT_TIMEOUT)
                try:
                    return await fn(problem, client)
                finally:
                    await client.close()

            box["value"] = asyncio.run(go())
        else:
            client = openai.OpenAI(base_url=base_url, api_key="maxit", max_retries=0, timeout=CLIENT_TIMEOUT, http_client=http)
            box["value"] = fn(problem, client)
    except BaseException as exc:  # noqa: BLE001 - the program may raise anything, SystemExit included
        box["error"] = f"the program raised {type(exc).__name__}: {exc}"
    finally:
        done.set()


def _reward_error(workflow: ProgramWorkflow, returned: tuple[Any, str | None] | None) -> str | None:
    """Why an episode's return value is no reward (it raised, it returned no number or mapping
    of them, its mapping names no agent of the team), or None."""
    if returned is None:
        return "the program did not return"
    value, error = returned
    if error is not None:
        return error
    try:
        checked = team_value(value, "the program")
    except ValueError as err:
        return str(err)
    if isinstance(checked, Mapping):
        ids = {a.agent_id for a in workflow.agents}
        unknown = sorted(set(checked) - ids - {"team"})
        if unknown:
            return f"the program returned rewards for {unknown}, which are not agents of the team {sorted(ids)} (nor 'team')"
    return None


def _row_outcomes(value: Any, error: str | None, agent_id: str) -> tuple[Outcome, Outcome]:
    """(global, local) reward of one row of an episode that returned `value` (see the module doc)."""
    if error is not None:
        return Outcome(None, error), Outcome(None, error)
    if value is None:
        return Outcome(None, "the program returned None"), Outcome(None, "the program returned None")
    if not isinstance(value, Mapping):
        v = float(value)
        return Outcome(v), Outcome(v)
    own = value.get(agent_id, value.get("team"))
    if own is None:
        why = f"the program returned no reward for agent {agent_id!r} (nor 'team')"
        return Outcome(None, why), Outcome(None, why)
    team_v = value.get("team", own)
    return (Outcome(float(team_v)) if team_v is not None else Outcome(None, "the program returned None for 'team'")), Outcome(float(own))


def _load(program: str) -> tuple[Any, Callable]:
    """(module, function) of "FILE.py:FUNC" or "pkg.module:func"; a one-line ConfigError else."""
    name = PREFIX + program
    module_name, sep, attr = program.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"workflow {name!r}: expected program:FILE.py:FUNC or program:package.module:function")
    module, fn = resolve(program, name)
    if not callable(fn) or isinstance(fn, type):
        raise ConfigError(f"workflow {name!r}: {attr!r} is not a function (a program is a function (problem, client) -> reward)")
    try:
        params = [p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = None
    if params is not None and len(params) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values()):
        raise ConfigError(f"workflow {name!r}: {attr}() must take (problem, client), it takes {len(params)} positional parameter(s)")
    return module, fn


def _agents(name: str, declared: object) -> tuple[Agent, ...]:
    if declared is None:
        raise ConfigError(f"workflow {name!r}: declare the agents: AGENTS = ['proposer', 'checker'] in the module, or @team('proposer', 'checker') on the function")
    if isinstance(declared, str) or not isinstance(declared, (list, tuple)) or not declared:
        raise ConfigError(f"workflow {name!r}: AGENTS must be a non-empty list of agent ids, got {declared!r}")
    out = []
    for a in declared:
        if isinstance(a, Agent):
            out.append(a)
        elif isinstance(a, str) and a:
            out.append(Agent(a))
        else:
            raise ConfigError(f"workflow {name!r}: an agent must be a non-empty string or an Agent, got {a!r}")
    return tuple(out)


def _problem(name: str, split: str, index: int, p: object) -> Problem:
    """A program's problem as a `Problem` (dicts: question, answer, optional uid and hint)."""
    if isinstance(p, Problem):
        return p
    if not isinstance(p, Mapping):
        raise DataError(f"workflow {name!r}: problems({split!r}) item {index} is a {type(p).__name__}, expected a Problem or a dict with question and answer")
    question, answer = p.get("question"), p.get("answer")
    if not isinstance(question, str) or answer is None:
        raise DataError(f"workflow {name!r}: problems({split!r}) item {index} needs a string 'question' and an 'answer'")
    uid = p.get("uid")
    if uid is None:
        uid = f"{split}-" + hashlib.blake2b(question.encode(), digest_size=6).hexdigest()
    hint = p.get("hint")
    return Problem(uid=str(uid), question=question, answer=str(answer), split=split, hint=None if hint is None else str(hint))
