"""A proposer and a checker written with the plain `openai` client, trained by maxit as they are.

    maxit run --workflow program:examples/openai_team.py:run --strategies iid prompt_aug --rounds 3

`run(problem, client)` is an ordinary OpenAI-API program: the proposer answers the sum, the
checker works it out again without seeing the proposal, and the team's answer stands when the
two agree. maxit hands it a client pointed at its endpoint, where `model` names the agent; every
call becomes a `steps` row. Rewards: each agent's own answer right, and the team's (the proposal
right and the checker agreeing) as every row's global reward. The prompts are the ones the
embedded arithmetic model was warm-started on ("12+45=").
"""

import re

AGENTS = ["proposer", "checker"]
MAX_TOKENS = 16  # answers are a few digits


def problems(split, n, seed):
    """The math task's addition problems (train and held-out never share one)."""
    from pipeline.tasks import make_task

    return make_task("arithmetic").problems(split, n, seed)


def default_model():
    """The embedded arithmetic model (built once, cached)."""
    from pipeline.workflows.math.model import default_model

    return default_model()


def number(text):
    found = re.findall(r"-?\d+", text or "")
    return int(found[-1]) if found else None


def ask(client, agent, content):
    reply = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": content}])
    return reply.choices[0].message.content


def run(problem, client):
    proposal = number(ask(client, "proposer", problem.question))
    check = number(ask(client, "checker", f"{problem.question}\nCheck it: work it out again."))
    answer = int(problem.answer)
    return {
        "proposer": float(proposal == answer),
        "checker": float(check == answer),
        "team": float(proposal == answer and check == proposal),
    }
