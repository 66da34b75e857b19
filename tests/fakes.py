"""Fakes for rollout tests: a character tokenizer with a chat template, a scripted sampler that
plays Solver and Verifier on arithmetic questions, and a small arithmetic task.

The sampler follows the Sampler contract exactly: n samples per prompt, token ids with one
logprob each, `text` decoded from the ids, "length" when `max_tokens` cut the completion, and
independent draws for every (prompt position, sample) even when prompts repeat.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pipeline.types import Message, Problem, Sample

ROLE_MARK = {"system": "\x01", "user": "\x02", "assistant": "\x03"}
END = "\x04"
VERIFY_MARK = "Verify the proposed answer."


class FakeTokenizer:
    """One token per character (its code point); a chat turn is <role mark>content<end>."""

    def apply_chat_template(self, conversation, add_generation_prompt=False, tokenize=True, return_dict=False):
        text = "".join(ROLE_MARK[m["role"]] + m["content"] + END for m in conversation)
        if add_generation_prompt:
            text += ROLE_MARK["assistant"]
        return [ord(c) for c in text] if tokenize else text

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


@dataclass
class Call:
    """One recorded `generate` call."""

    prompts: list[list[int]]
    n: int
    temperature: float
    max_tokens: int
    seed: int


@dataclass
class FakeSampler:
    """Plays both roles from the prompt text.

    Solver: answers "The answer is X." with X right with probability `solver_accuracy` (raised
    by `hint_bonus` when a hint is in the context). Verifier: says "yes" or "no", correct with
    probability `verifier_accuracy`, or "hmm" (unparsable) with probability `garbage`."""

    solver_accuracy: float = 0.5
    verifier_accuracy: float = 0.8
    hint_bonus: float = 0.3
    garbage: float = 0.05
    delay: float = 0.0
    engine: str = "fake"
    model_dir: Path = Path("fake-model")
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    calls: list[Call] = field(default_factory=list)

    @property
    def model_version(self) -> str:
        return "fake-v0"

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        self.calls.append(Call([list(p) for p in prompt_ids], n, temperature, max_tokens, seed))
        if self.delay:
            time.sleep(self.delay)
        out = []
        for i, prompt in enumerate(prompt_ids):
            text = self.tokenizer.decode(prompt)
            row = []
            for j in range(n):
                rng = random.Random(f"{seed}/{i}/{j}")
                row.append(self._sample(text, rng, max_tokens))
            out.append(row)
        return out

    def _sample(self, prompt: str, rng: random.Random, max_tokens: int) -> Sample:
        last_user = prompt.rsplit(ROLE_MARK["user"], 1)[-1]
        if VERIFY_MARK in last_user:
            a, b, proposed = re.search(r"What is (-?\d+) \+ (-?\d+)\?.*Proposed answer: (.*?)\n", last_user, re.S).groups()
            nums = re.findall(r"-?\d+", proposed)
            right = bool(nums) and int(nums[-1]) == int(a) + int(b)
            u = rng.random()
            if u < self.garbage:
                text = "hmm"
            else:
                says_yes = right if rng.random() < self.verifier_accuracy else not right
                text = "yes" if says_yes else "no"
        else:
            a, b = re.search(r"What is (-?\d+) \+ (-?\d+)\?", prompt).groups()
            p = self.solver_accuracy + (self.hint_bonus if "Hint: " in prompt else 0.0)
            x = int(a) + int(b)
            if rng.random() >= p:
                x += rng.choice([-2, -1, 1, 2, 10])
            text = f"The answer is {x}."
        ids = self.tokenizer.encode(text) + [0]
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        logprobs = [-rng.random() * 2 for _ in ids]
        return Sample(token_ids=ids, logprobs=logprobs, text=self.tokenizer.decode([t for t in ids if t != 0]), finish_reason=finish)

    def load_checkpoint(self, model_dir) -> None:
        self.model_dir = Path(model_dir)

    def close(self) -> None:
        pass


@dataclass
class FakeTask:
    """Additions "What is a + b?" with a hint, a yes/no verdict and a last-integer reward."""

    name: str = "fake_arithmetic"

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"{split}/{seed}")
        out = []
        for i in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            out.append(Problem(uid=f"{split}-{seed}-{i}", question=f"What is {a} + {b}?", answer=str(a + b), split=split, hint=f"{a} + {b} = {a} + {b // 10 * 10} + {b % 10}"))
        return out

    def solver_messages(self, problem: Problem) -> list[Message]:
        return [Message(role="system", content="Solve the problem."), Message(role="user", content=problem.question)]

    def verifier_messages(self, problem: Problem, solver_text: str) -> list[Message]:
        return [
            Message(role="system", content="You check answers."),
            Message(role="user", content=f"{problem.question}\nProposed answer: {solver_text}\n{VERIFY_MARK} Reply yes or no."),
        ]

    def feedback_message(self, problem: Problem, attempt_text: str) -> Message:
        ok = self.reward(problem, attempt_text) == 1.0
        return Message(role="user", content="That is correct." if ok else "That is wrong; try again.")

    def reward(self, problem: Problem, completion_text: str) -> float | None:
        nums = re.findall(r"-?\d+", completion_text)
        return 1.0 if nums and nums[-1] == problem.answer else 0.0

    def parse_verdict(self, text: str) -> bool | None:
        t = text.strip().lower()
        if t.startswith("yes"):
            return True
        if t.startswith("no"):
            return False
        return None
