"""Warm-start SFT of the default model on the default task's formats, so the first round of
expert iteration starts from a Solver that is sometimes right (and a Verifier that works the
sum out again), with clear room to improve.

Examples (mixed in every batch, loss on the completion tokens only, EOS included; each batch is
run as two length buckets so short Solver prompts are not padded to the Verifier's length):
- Solver plain:   user "123+45="                                    -> "168"
- Solver hinted:  system "Hint: the tens digit is 6" (or "16_"), user -> "168"
- Verifier:       blind (the arithmetic default): user "<q>\\nCheck it: work it out again." -> the
                  right answer ("168"); the task compares it with the proposal.
                  Shown the proposal (a template with `{solution}`):
                  user "<q>\\nProposed answer: <a>\\nIs it right? ..." -> "<right answer> yes" /
                  "<right answer> no" (`verifier_target="answer_verdict"`, the default; the
                  arithmetic task reads the verdict by comparing that answer with the proposal);
                  "verdict" teaches "yes" / "no" alone, "answer" the right answer alone
                  (half right, half near misses: one digit off, +-1, +-10, +-100)
- Feedback:       user q, assistant attempt1, user "That is wrong. Try again." -> right answer
                  (or a right attempt1, "That is right. Say it again." -> the same answer)

Stopping point: the SFT accuracy curve is steep and its onset moves by hundreds of steps between
seeds (docs/FINDINGS.md, "Warm start"), so a fixed step count could stop anywhere from a Solver
that is never right to one with little left to learn. Instead, every `probe_every` steps the plain Solver is sampled at T=1 on
`probe_size` *train-split* problems, and training stops at the first probe at or above
`target_accuracy` (or at `max_steps`). The probe is seeded, so the whole warm start is
deterministic from the seed. Held-out problems are never trained on nor used to stop.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from pipeline.errors import ConfigError
from pipeline.models.sft import FastEncoder, generate_texts, seeded_sampling, sft_steps
from pipeline.types import Message

__all__ = [
    "WarmStartConfig",
    "WarmStartResult",
    "sft_examples",
    "warm_start",
    "solver_accuracy",
]


VERIFIER_TARGETS = ("answer", "verdict", "answer_verdict")


@dataclass(frozen=True)
class WarmStartConfig:
    """Settings of the warm-start SFT.

    Parameters that control the optimizer."""

    batch_size: int = 128
    """Examples per step (the prototype's setting, docs/FINDINGS.md; a smaller batch kept the
    Solver from taking off for hundreds of steps: docs/results/choices.md)."""
    lr: float = 3e-3
    """Peak AdamW learning rate (docs/FINDINGS.md: 3e-3 with batch 128)."""
    warmup_steps: int = 30
    """Linear warmup from 0 to `lr`; constant afterwards."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_steps: int = 3000
    """Hard cap on optimizer steps (the plateau before the Solver takes off lasts 600+ steps)."""
    min_steps: int = 200
    """No probe (and so no stopping) before this many steps."""
    # Parameters that control the stopping rule.
    target_accuracy: float = 0.35
    """Stop at the first probe whose plain-Solver T=1 accuracy (train split) reaches this: a
    Solver that starts weaker leaves the Verifier, which checks by working the sum out again, at
    chance (docs/results/choices.md)."""
    probe_every: int = 25
    """Steps between probes."""
    probe_size: int = 512
    """Train-split problems sampled once each at each probe. 512 (standard error about 2 points
    near 30%): with a smaller probe its noise, not the model, decided where the warm start
    stopped, and so how good the built model was (docs/results/choices.md)."""
    # Parameters that control the example mix (normalized to sum 1).
    mix_plain: float = 0.55
    """Share of plain Solver examples."""
    mix_hint: float = 0.2
    """Share of hinted Solver examples (half "tens", half "prefix" hints)."""
    mix_verifier: float = 0.15
    """Share of Verifier examples (half right, half wrong proposals)."""
    verifier_target: str = "answer_verdict"
    """What a Verifier example teaches it to write: "answer_verdict" (the default): the right
    answer, then the verdict ("168 no"); the arithmetic task reads the Verifier's verdict by
    comparing the answer it writes with the proposal (verdict style "compare"). "verdict": "yes" /
    "no" alone; "answer": the right answer alone. On the main job (docs/results/verifier.md, "The
    Verifier") the 1M model's yes/no never discriminated, with "verdict" or after its own answer
    (where the word does not follow the answer either), while the answer itself does the
    checking; "answer" alone made it copy the proposal more often.
    A blind Verifier (a task template whose Verifier does not see the proposal,
    `PromptTemplate.verifier_sees_solution` False) is always taught the right answer alone."""
    verifier_right_share: float = 0.5
    """Share of Verifier examples whose proposal is right (the rest are near misses)."""
    mix_feedback: float = 0.1
    """Share of second-attempt examples after feedback."""
    seed: int = 0
    """Seed of the examples, the probes and the optimizer's data order."""
    threads: int | None = None
    """torch threads (None: leave torch's setting)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_steps", "probe_every", "probe_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"warm_start.{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"warm_start.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0 or self.min_steps < 0:
            raise ConfigError("warm_start.warmup_steps and warm_start.min_steps must be >= 0")
        if not 0 <= self.verifier_right_share <= 1:
            raise ConfigError(f"warm_start.verifier_right_share must be in [0, 1], got {self.verifier_right_share}")
        if not 0 < self.target_accuracy <= 1:
            raise ConfigError(f"warm_start.target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if self.verifier_target not in VERIFIER_TARGETS:
            raise ConfigError(f"warm_start.verifier_target must be one of {list(VERIFIER_TARGETS)}, got {self.verifier_target!r}")
        mix = (self.mix_plain, self.mix_hint, self.mix_verifier, self.mix_feedback)
        if min(mix) < 0 or self.mix_plain <= 0:
            raise ConfigError(f"warm_start.mix_* must be >= 0 and mix_plain > 0, got {mix}")


@dataclass
class WarmStartResult:
    """What a warm start did."""

    steps: int
    """Optimizer steps taken."""
    seconds: float
    """Wall time of the SFT (probes included)."""
    probe_accuracy: float
    """Last train-split probe accuracy (plain Solver, T=1)."""
    stopped_early: bool
    """True if the target accuracy was reached before max_steps."""
    history: list[tuple[int, float]] = field(default_factory=list)
    """(step, probe accuracy) of every probe."""


def _near_miss(answer: int, rng: random.Random) -> int:
    """A plausible wrong answer: one digit changed, or off by 1, 10 or 100."""
    for _ in range(20):
        kind = rng.random()
        if kind < 0.5:
            digits = list(str(answer))
            i = rng.randrange(len(digits))
            digits[i] = str(rng.choice([d for d in range(10) if str(d) != digits[i]]))
            wrong = int("".join(digits))
        else:
            wrong = answer + rng.choice([-1, 1]) * rng.choice([1, 10, 100])
        if wrong != answer and wrong >= 0:
            return wrong
    return answer + 1


def sft_examples(task, rng: random.Random, n: int, config: WarmStartConfig) -> list[tuple[list[Message], str]]:
    """`n` (messages, target) pairs of the mix in `config`, on train-split problems of `task`."""
    from pipeline.strategies import HINT_PREFIX
    from pipeline.tasks.arithmetic import make_hint
    from pipeline.tasks.base import RIGHT_FEEDBACK, WRONG_FEEDBACK

    weights = [config.mix_plain, config.mix_hint, config.mix_verifier, config.mix_feedback]
    prompts = getattr(task, "prompts", None)
    blind_verifier = prompts is not None and not prompts.verifier_sees_solution
    out: list[tuple[list[Message], str]] = []
    while len(out) < n:
        a, op, b = task.sample_operands(rng)
        if task.split_of(a, op, b) != "train":
            continue
        p = task.make_problem(a, op, b)
        ans = int(p.answer)
        kind = rng.choices(range(4), weights)[0]
        plain = task.solver_messages(p)
        if kind == 0:
            out.append((plain, p.answer))
        elif kind == 1:
            hint = make_hint(ans, rng.choice(["tens", "prefix"]))
            out.append(([Message(role="system", content=HINT_PREFIX + hint), *plain], p.answer))
        elif kind == 2:
            right = rng.random() < config.verifier_right_share
            proposed = str(ans if right else _near_miss(ans, rng))
            verdict = "yes" if right else "no"
            if blind_verifier:  # it does not see the proposal: a verdict word would be a guess
                target = p.answer
            else:
                target = {"answer": p.answer, "verdict": verdict, "answer_verdict": f"{p.answer} {verdict}"}[config.verifier_target]
            out.append((task.verifier_messages(p, proposed), target))
        else:
            right = rng.random() < 0.3
            attempt = p.answer if right else str(_near_miss(ans, rng))
            msgs = [*plain, Message(role="assistant", content=attempt), Message(role="user", content=RIGHT_FEEDBACK if right else WRONG_FEEDBACK)]
            out.append((msgs, p.answer))
    return out


def solver_accuracy(
    model,
    tokenizer,
    problems,
    task,
    temperature: float = 1.0,
    samples: int = 1,
    hint: bool = False,
    seed: int = 0,
    max_new_tokens: int = 8,
    batch_size: int = 512,
) -> float:
    """Mean reward of the Solver on `problems` (`samples` each) with transformers sampling
    (top_k=0, top_p=1: the plain temperature distribution; temperature 0 = greedy)."""
    from pipeline.strategies import PromptAug

    aug = PromptAug()
    enc = FastEncoder(tokenizer)
    contexts = []
    for p in problems:
        msgs = task.solver_messages(p)
        contexts.append(aug.augment(msgs, p) if hint else msgs)
    prompts = [pr for pr, _ in enc.encode([(m, "") for m in contexts])]
    rows = [i for i in range(len(prompts)) for _ in range(samples)]
    with seeded_sampling(model, seed):
        texts = generate_texts(model, tokenizer, [prompts[i] for i in rows], temperature, max_new_tokens, batch_size)
    total = sum(task.reward(problems[i], text) or 0.0 for i, text in zip(rows, texts))
    return total / max(1, len(rows))


def warm_start(model, tokenizer, config: WarmStartConfig = WarmStartConfig(), task=None, log: Callable[[str], None] = print) -> WarmStartResult:
    """Train `model` in place by SFT on the default task's formats until the stopping rule fires."""
    import torch

    from pipeline.tasks.arithmetic import ArithmeticTask

    task = task or ArithmeticTask()
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = random.Random(f"warm-start:{config.seed}")
    probe = task.problems("train", config.probe_size, seed=10_000 + config.seed)
    FastEncoder(tokenizer).check(sft_examples(task, random.Random(0), 16, config))
    steps = sft_steps(
        model, tokenizer, lambda step: sft_examples(task, rng, config.batch_size, config), steps=config.max_steps, lr=config.lr,
        lr_lambda=lambda s: min(1.0, (s + 1) / max(1, config.warmup_steps)), weight_decay=config.weight_decay,
    )
    t0 = time.perf_counter()
    history: list[tuple[int, float]] = []
    acc = 0.0
    loss_avg = math.nan
    step = 0
    stopped = False
    for step, loss in steps:
        loss_avg = loss if math.isnan(loss_avg) else 0.9 * loss_avg + 0.1 * loss
        if step % config.probe_every:
            continue
        line = f"warm start: step {step:4d}/{config.max_steps}  loss {loss_avg:.3f}  "
        if step < config.min_steps:  # no probe yet, but a line, so a slow machine shows it is alive
            log(f"{line}(accuracy probes from step {config.min_steps})  {time.perf_counter() - t0:5.1f}s")
            continue
        acc = solver_accuracy(model, tokenizer, probe, task, temperature=1.0, seed=config.seed * 7919 + step)
        history.append((step, acc))
        log(f"{line}solver T=1 acc (train probe) {acc:6.1%}  {time.perf_counter() - t0:5.1f}s")
        if acc >= config.target_accuracy:
            stopped = True
            break
    model.eval()
    return WarmStartResult(step, time.perf_counter() - t0, acc, stopped, history)
