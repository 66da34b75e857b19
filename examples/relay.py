"""A team of three in one file: a relay that adds four numbers, one addition per agent.

    maxit run --workflow examples/relay.py:Relay --rounds 5

`first` adds a + b, `second` adds c to what `first` wrote, `third` adds d to that. Local
reward: the agent's own addition is right (on the number it was handed); team reward: the
final sum is a + b + c + d. The embedded arithmetic model already reads "x+y=".
"""

import random
import re

from pipeline.types import Problem
from pipeline.workflows import Agent, Env, StepResult, Workflow

AGENTS = ("first", "second", "third")


def number(text):
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


class RelayEnv(Env):
    def __init__(self, problem):
        self.terms = [int(x) for x in problem.question.split("+")]
        self.running = self.terms[0]  # what the next agent is handed
        self.turn = 0

    def observe(self, agent_id):
        return [{"role": "user", "content": f"{self.running}+{self.terms[self.turn + 1]}="}]

    def step(self, agent_id, text):
        right = self.running + self.terms[self.turn + 1]
        said = number(text)
        self.running = said if said is not None else 0
        self.turn += 1
        return StepResult(reward=float(said == right), done=self.turn == len(AGENTS))

    def team_reward(self):
        return float(self.turn == len(AGENTS) and self.running == sum(self.terms))


class Relay(Workflow):
    name = "relay"
    agents = tuple(Agent(a) for a in AGENTS)

    def problems(self, split, n, seed):
        rng = random.Random(f"{split}/{seed}")
        out = {}
        while len(out) < n:
            terms = [rng.randint(10, 60) for _ in range(4)]
            if (sum(terms) % 2 == 0) == (split == "train"):  # train and heldout never share a problem
                q = "+".join(map(str, terms))
                out[q] = Problem(uid=f"relay:{q}", question=q, answer=str(sum(terms)), split=split)
        return list(out.values())

    def reset(self, problem, strategy):
        return RelayEnv(problem)

    def default_model(self):
        from pipeline.workflows.math.model import default_model

        return default_model()
