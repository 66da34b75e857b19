"""The `math_review` team's starting model: the cached default model (`model.py`) fine-tuned
for a few hundred steps on the review format, cached under its own key
(`<cache>/models/review-<hash of the base model's folder and these settings>`).

Why a warm start of its own: the default model has never seen a Verifier prompt that shows the
proposal, nor written a verdict word after a sum (its Verifier is blind and writes the sum
alone). Shown "12+34=\\nProposed answer: 46\\nIs it right?" it writes a number and no verdict, so
every verdict is unparsable, its local reward is 0, and rejection sampling keeps none of its rows:
expert iteration has nothing to start from (docs/results/math-review.md measures it).

Examples (made in code from TRAIN-split problems only; held-out problems are never trained on):
- review:  user "<q>\\nProposed answer: <a>\\nIs it right?" -> "<right sum> yes" or
  "<right sum> no": half right proposals, half near misses (`near_miss`: one carry dropped, one
  digit off), so "yes" and "no" are equally common and neither wins by frequency;
- Solver:  user "<q>" -> the base model's OWN sampled answer at T=1 (right or wrong), drawn once
  before training, meant to hold the Solver where the default model left it rather than teach it
  the sums. It does not hold it: a zero-mean gradient in expectation, but Adam at this learning
  rate turns its noise into full-size steps, and the Solver comes out well below the default
  model's (docs/results/math-review.md). A known defect of this build, not yet mended.

`python -m pipeline.workflows.math.review_model`: build (or reuse) it and print its record.
"""

from __future__ import annotations

import argparse
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from pipeline.errors import ConfigError
from pipeline.types import Message

__all__ = ["ReviewWarmConfig", "review_examples", "build_review_model", "review_model", "main"]

REVIEW_BUILD_VERSION = 1
"""Bump when the build code changes what it produces, so old cached models are not reused."""


@dataclass(frozen=True)
class ReviewWarmConfig:
    """Settings of the review-format fine-tune."""

    steps: int = 80
    """Optimizer steps (a fixed count, no probe: what it must teach is the format, a verdict word
    after the sum, which rejection sampling then has rows to keep; how well the word follows
    the comparison is what the rounds train). Small, so the build stays within minutes on a
    shared 2-core machine."""
    batch_size: int = 64
    """Examples per step."""
    lr: float = 2e-3
    """AdamW learning rate after warm-up (below the warm start's 3e-3: a fine-tune of a trained model)."""
    warmup_steps: int = 10
    """Linear warm-up steps."""
    mix_review: float = 0.6
    """Share of review examples in a batch; the rest are the Solver's own answers."""
    solver_pool: int = 1024
    """Train problems whose base-model answer is sampled once for the Solver examples."""
    seed: int = 0
    """Seed of the examples, the Solver pool's sampling and the data order."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "solver_pool"):
            if getattr(self, name) < 1:
                raise ConfigError(f"review warm start: {name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or self.warmup_steps < 0:
            raise ConfigError(f"review warm start: lr must be > 0 and warmup_steps >= 0, got {self.lr}, {self.warmup_steps}")
        if not 0 < self.mix_review <= 1:
            raise ConfigError(f"review warm start: mix_review must be in (0, 1], got {self.mix_review}")


def review_examples(task, rng: random.Random, n: int) -> list[tuple[list[Message], str]]:
    """`n` review examples ((messages, target)) on train-split problems of the arithmetic `task`
    (its prompts must show the proposal: `REVIEW_PROMPTS`), half right proposals, half near misses."""
    from pipeline.workflows.math.review_set import near_miss

    out: list[tuple[list[Message], str]] = []
    while len(out) < n:
        a, op, b = task.sample_operands(rng)
        if task.split_of(a, op, b) != "train":
            continue
        p = task.make_problem(a, op, b)
        right = rng.random() < 0.5
        proposed = p.answer if right else str(near_miss(p, rng))
        out.append((task.verifier_messages(p, proposed), f"{p.answer} {'yes' if right else 'no'}"))
    return out


def _solver_pool(model, tokenizer, task, config: ReviewWarmConfig) -> list[tuple[list[Message], str]]:
    """The base model's own T=1 answers to `solver_pool` train problems, as Solver examples."""
    from pipeline.models.sft import FastEncoder, generate_texts, seeded_sampling

    problems = task.problems("train", config.solver_pool, seed=20_000 + config.seed)
    msgs = [task.solver_messages(p) for p in problems]
    prompts = [pr for pr, _ in FastEncoder(tokenizer).encode([(m, "") for m in msgs])]
    with seeded_sampling(model, config.seed):
        texts = generate_texts(model, tokenizer, prompts, 1.0, 8, 512)
    return [(m, t.strip()) for m, t in zip(msgs, texts) if t.strip()]


def _verdict_accuracy(model, tokenizer, task, pairs, temperature: float, seed: int) -> dict[str, float]:
    """The model's verdicts on the balanced set's `pairs` (`review_set.review_set_metrics`)."""
    from pipeline.models.sft import FastEncoder, generate_texts, seeded_sampling
    from pipeline.workflows.math.review_set import review_set_metrics, verdict_of

    prompts = [pr for pr, _ in FastEncoder(tokenizer).encode([(task.verifier_messages(p.problem, p.answer), "") for p in pairs])]
    with seeded_sampling(model, seed):
        texts = generate_texts(model, tokenizer, prompts, temperature, 12, 512)
    return review_set_metrics(task, pairs, [verdict_of(task, t) for t in texts])


def _solver_heldout(model, tokenizer, task) -> float:
    """The Solver's held-out accuracy at T=1 (250 problems x 2 samples): what the fine-tune must
    leave where it was."""
    from pipeline.workflows.math.warmstart import solver_accuracy

    return solver_accuracy(model, tokenizer, task.problems("heldout", 250, seed=0), task, 1.0, 2, seed=0)


def build_review_model(cache_dir: str | Path | None = None, config: ReviewWarmConfig | None = None, force: bool = False, log: Callable[[str], None] = print) -> Path:
    """The review model's folder: the default model (built first if missing) fine-tuned by
    `config`, built once and cached (`pipeline.models.build.cached_build`)."""
    from pipeline.models import build_info, load_model, load_tokenizer
    from pipeline.models.build import cached_build
    from pipeline.models.sft import sft_steps
    from pipeline.tasks.arithmetic import ArithmeticTask
    from pipeline.tasks.prompts import REVIEW_PROMPTS
    from pipeline.workflows.math.model import default_model
    from pipeline.workflows.math.review_set import balanced_review_set

    config = config or ReviewWarmConfig()
    base = default_model(cache_dir)
    task = ArithmeticTask(prompts=REVIEW_PROMPTS)
    trained = ("user", "system", "verifier_user", "verifier_system")
    settings = {
        "version": REVIEW_BUILD_VERSION, "base": base.name, "config": asdict(config),
        "prompts": {name: getattr(REVIEW_PROMPTS, name) for name in trained},
    }

    def build(folder: Path) -> dict:
        import torch

        for f in base.iterdir():  # tokenizer, chat template, generation config: the base model's
            if f.is_file() and f.suffix != ".safetensors" and f.name != "maxit_build.json":
                shutil.copy2(f, folder / f.name)
        tok, model = load_tokenizer(base), load_model(base)
        t0 = time.perf_counter()
        heldout = balanced_review_set(task)
        before = _verdict_accuracy(model, tok, task, heldout, 0.0, config.seed)
        solver_before = _solver_heldout(model, tok, task)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            pool = _solver_pool(model, tok, task, config)
            rng = random.Random(f"review-warm-start:{config.seed}")
            n_review = round(config.batch_size * config.mix_review)

            def batch(step: int) -> list[tuple[list[Message], str]]:
                return review_examples(task, rng, n_review) + rng.sample(pool, config.batch_size - n_review)

            loss = float("nan")
            for step, loss in sft_steps(model, tok, batch, steps=config.steps, lr=config.lr,
                                        lr_lambda=lambda s: min(1.0, (s + 1) / max(1, config.warmup_steps))):
                if step % 20 == 0:
                    log(f"review warm start: step {step:4d}/{config.steps}  loss {loss:.3f}  {time.perf_counter() - t0:5.1f}s")
        model.eval()
        model.save_pretrained(str(folder), safe_serialization=True)
        after = _verdict_accuracy(model, tok, task, heldout, 0.0, config.seed)
        solver_after = _solver_heldout(model, tok, task)
        log(f"review model ready in {time.perf_counter() - t0:.0f}s: held-out balanced verdict accuracy (greedy) "
            f"{before['balanced']:.1%} -> {after['balanced']:.1%} ({after['parsable']:.1%} parsable); Solver held-out "
            f"T=1 {solver_before:.1%} -> {solver_after:.1%}")
        return {
            "build_version": REVIEW_BUILD_VERSION, "base": str(base), "base_build": build_info(base).get("heldout_acc_t1"),
            "config": asdict(config), "final_loss": loss, "verdicts_before": before, "verdicts_after": after,
            "solver_heldout_t1_before": solver_before, "solver_heldout_t1_after": solver_after,
        }

    return cached_build(cache_dir, "review", settings, build, what="the review model (math_review's warm start)", force=force, log=log)


def review_model(cache_dir: str | Path | None = None) -> Path:
    """The review model's folder: built on the first call, reused afterwards."""
    return build_review_model(cache_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.workflows.math.review_model", description=__doc__)
    ap.add_argument("--cache-dir", default=None, help="default: the project's cache folder")
    ap.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    args = ap.parse_args(argv)
    from pipeline.models import build_info

    path = build_review_model(args.cache_dir, force=args.force)
    info = build_info(path)
    print(f"model: {path}")
    for when in ("verdicts_before", "verdicts_after"):
        v = info[when]
        print(f"  {when}: balanced {v['balanced']:.1%} (right {v['right']:.1%}, wrong {v['wrong']:.1%}, parsable {v['parsable']:.1%})")
    print(f"  Solver held-out T=1: {info['solver_heldout_t1_before']:.1%} -> {info['solver_heldout_t1_after']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
