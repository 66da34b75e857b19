"""A verifiers environment played through maxit's endpoint: each episode runs `vf-eval` on the
environment in `examples/verifiers_sum` (verifiers 0.4, its null harness, a local subprocess
runtime), with the episode's client URL as its provider; every model call the harness makes is
a `steps` row, and the environment's rubric score is the episode's reward.

verifiers 0.4 needs openai < 3, so it lives in a venv of its own; MAXIT_VF_EVAL names its vf-eval:

    python -m venv /tmp/vf && /tmp/vf/bin/pip install "verifiers==0.4.*" -e examples/verifiers_sum
    MAXIT_VF_EVAL=/tmp/vf/bin/vf-eval maxit run --workflow program:examples/verifiers_program.py:run \\
        --strategies iid prompt_aug --rounds 1
"""

import json
import os
import subprocess
import tempfile
from pathlib import Path

AGENTS = ["adder"]
MAX_TOKENS = 16


def problems(split, n, seed):
    from pipeline.tasks import make_task

    return make_task("arithmetic").problems(split, n, seed)


def default_model():
    from pipeline.workflows.math.model import default_model

    return default_model()


def run(problem, client):
    vf_eval = os.environ.get("MAXIT_VF_EVAL")
    if not vf_eval:
        raise RuntimeError("set MAXIT_VF_EVAL to the vf-eval of a venv with verifiers 0.4 and examples/verifiers_sum installed")
    with tempfile.TemporaryDirectory(prefix="maxit-vf-") as out:
        subprocess.run(
            [vf_eval, "sum-v1", "-n", "1", "-r", "1", "--model", AGENTS[0], "--client.base-url", str(client.base_url),
             "--client.api-key-var", "MAXIT_VF_KEY", "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess",
             "--no-push", "--output-dir", out, "--env.taskset.question", problem.question, "--env.taskset.answer", problem.answer],
            env={**os.environ, "MAXIT_VF_KEY": "unused"}, check=True, capture_output=True, timeout=600,
        )
        (traces,) = Path(out).glob("*/traces.jsonl")
        episode = json.loads(traces.read_text().splitlines()[0])
    (trace,) = episode["traces"]
    if trace["errors"]:
        raise RuntimeError(f"verifiers: {trace['errors'][0]['message']}")
    return trace["rewards"]["reward"]["score"]
