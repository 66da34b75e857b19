"""Workflows: a team and its environment in one object. The contract a workflow meets
(`Workflow`, `Env`, `StepResult`, `Agent`) lives with the loop that runs it, in
`pipeline.rollout`, and is handed on from here, where a user's workflow imports it.

Built in:
- `math` (default): DrMAS's Solver and Verifier on a task with a checkable answer;
- `single`: the Solver alone on the same task (a team of one: GRPO's setting);
- `math_review`: the math team with DrMAS's Verifier, shown the Solver's answer and rewarded for a
  right verdict (`pipeline.workflows.math.review`);
- `grid`: a stateful path-finding game played by a planner and a mover over several turns;
- `plan_path`: AT-GRPO's Plan-Path shape: a tool agent's path run as a trial by the environment, a
  plan agent that reads the call and its output and commits the moves (`pipeline.workflows.plan_path`);
- `code`: a Coder writes a Python function, a Tester writes unit tests for it (AT-GRPO's code task);
- `reasoning_gym`: any reasoning-gym dataset, scored by its own scorer, played by a Solver, a
  Solver/Verifier pair or a tool agent and a plan agent (the `envs` extra);
- `tic_tac_toe`, `bargaining`: two-player OpenSpiel games in self-play (the `games` extra).

A program of OpenAI API calls, trained as it is: `load_workflow("program:path/to/file.py:run")` or
`"program:my_pkg.module:run"` (`pipeline.workflows.program`: each call goes through a recording
endpoint, `pipeline.rollout.endpoint`).

A user's own: `load_workflow("my_pkg.module:Name")` or `load_workflow("path/to/file.py:Name")`
(a `Workflow` subclass or a function returning a workflow), or the name of a `maxit.workflows`
entry point, built with the options its constructor takes (any other is refused, naming the
options it takes). docs/WORKFLOWS.md has the contract and a complete example.
"""

from __future__ import annotations

import functools
import inspect
from importlib import metadata
from typing import Any, Callable, Mapping

from pipeline.errors import ConfigError, DataError
from pipeline.rollout.agent import SHARED_POLICY, Agent
from pipeline.rollout.contract import Env, StepResult, check_workflow
from pipeline.rollout.workflow import Workflow, with_policies
from pipeline.workflows.modules import resolve

__all__ = [
    "Agent", "SHARED_POLICY", "Env", "StepResult", "Workflow", "check_workflow", "load_workflow", "with_policies", "workflow_options",
    "WORKFLOW_NAMES", "ENTRY_POINT_GROUP", "RUN_SETTINGS", "workflow_run_defaults",
]

ENTRY_POINT_GROUP = "maxit.workflows"


def _builtin(name: str) -> Callable[..., Workflow] | None:
    if name in ("math", "single"):
        from pipeline.workflows.math import MathWorkflow, SingleWorkflow

        return MathWorkflow if name == "math" else SingleWorkflow
    if name == "grid":
        from pipeline.workflows.grid import GridWorkflow

        return GridWorkflow
    if name == "code":
        from pipeline.workflows.code import CodeWorkflow

        return CodeWorkflow
    if name in ("tic_tac_toe", "bargaining"):
        from pipeline.workflows.games import GAME_WORKFLOWS

        return GAME_WORKFLOWS[name]
    if name == "reasoning_gym":
        from pipeline.workflows.reasoning_gym import ReasoningGymWorkflow

        return ReasoningGymWorkflow
    if name == "math_review":
        from pipeline.workflows.math.review import ReviewWorkflow

        return ReviewWorkflow
    if name == "plan_path":
        from pipeline.workflows.plan_path import PlanPathWorkflow

        return PlanPathWorkflow
    return None


WORKFLOW_NAMES = ("math", "single", "math_review", "grid", "plan_path", "code", "tic_tac_toe", "bargaining", "reasoning_gym")


def _resolve(spec: str) -> Callable[..., Workflow]:
    if spec.startswith("program:"):  # a program of OpenAI API calls (pipeline.workflows.program)
        from pipeline.workflows.program import ProgramWorkflow

        return functools.partial(ProgramWorkflow, spec[len("program:"):])
    builtin = _builtin(spec)
    if builtin is not None:
        return builtin
    if ":" in spec:
        return resolve(spec, spec)[1]
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == spec:
            try:
                return ep.load()
            except Exception as err:  # noqa: BLE001
                raise ConfigError(f"workflow {spec!r}: loading entry point {ep.value!r} raised {type(err).__name__}: {err}") from None
    raise ConfigError(f"unknown workflow {spec!r}; choose from {list(WORKFLOW_NAMES)}, a 'module:Name' path or a {ENTRY_POINT_GROUP!r} entry point")


RUN_SETTINGS = ("task", "task_file", "max_loop_num")
"""Settings the run offers every workflow (`pipeline.run.rounds.build_workflow`: the run's task
or task file and its turn count): a workflow is built with those its constructor takes and
without the others. Every other option must be one the workflow takes."""


def load_workflow(spec: str | Workflow = "math", *, shared_policy: bool = True, **options: Any) -> Workflow:
    """The workflow named by `spec` (a built-in name, "module:Name", an entry point name, or a
    workflow object), built with `options` (its constructor's keyword parameters; the run's
    settings `RUN_SETTINGS` only where it takes them; None values are left unset), its agents on
    one shared policy or each on its own, and checked (`check_workflow`). A broken workflow, or
    an option it does not take, is a one-line `ConfigError` naming it (and the options it takes)."""
    if isinstance(spec, Workflow):
        _check_options(spec.name or type(spec).__name__, (), options)
        workflow = spec
    else:
        factory = _resolve(spec)
        accepted = workflow_options(factory)
        if accepted is not None:
            _check_options(spec, accepted, options)
        kwargs = {k: v for k, v in options.items() if v is not None and (accepted is None or k in accepted)}
        try:
            workflow = factory(**kwargs)
        except (ConfigError, DataError):  # already named: a bad setting, a bad row of a task file
            raise
        except Exception as err:  # noqa: BLE001 - a user's constructor may raise anything
            raise ConfigError(f"workflow {spec!r}: building it raised {type(err).__name__}: {err}") from None
        if not isinstance(workflow, Workflow):
            raise ConfigError(f"workflow {spec!r}: expected a pipeline.workflows.Workflow, got {type(workflow).__name__}")
    return check_workflow(with_policies(workflow, shared_policy))


def workflow_options(factory: Callable[..., Workflow]) -> tuple[str, ...] | None:
    """The options a workflow class or factory function takes: its keyword parameters (a
    class's constructor's, a dataclass's fields), in order; None when it takes any keyword
    (`**kwargs`) or its signature cannot be read (then its own error names a bad one)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


def _check_options(name: str, accepted: tuple[str, ...], options: dict) -> None:
    """A `ConfigError` naming the options the workflow does not take (the run's settings aside)
    and listing those it does."""
    unknown = [k for k in options if k not in accepted and k not in RUN_SETTINGS]
    if unknown:
        takes = f"it takes: {', '.join(accepted)}" if accepted else "it takes no options"
        raise ConfigError(f"workflow {name!r}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} ({takes})")


def workflow_run_defaults(spec: str) -> dict[str, Any]:
    """The `Workflow.run_defaults` of the workflow named by `spec` (its class's; none for a
    factory function), read without building it. A value that is not a mapping is a one-line
    `ConfigError` naming the workflow."""
    defaults = getattr(_resolve(spec), "run_defaults", {})
    if not isinstance(defaults, Mapping) or not all(isinstance(k, str) for k in defaults):
        raise ConfigError(f"workflow {spec!r}: run_defaults must map setting names to values, got {defaults!r}")
    return dict(defaults)
