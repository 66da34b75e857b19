"""The reasoning-gym workflow's embedded default model: the math default model's architecture
and tokenizer (`pipeline.workflows.math.model`: a 1.1M-parameter Llama; its byte-level BPE spells
any text, so every dataset's characters are covered), built in code and warm-started on the
workflow's own dataset and generator options, cached under
`<cache>/models/reasoning-gym-<dataset>-<hash of every build setting>`.

Initial weights (`RGWarmStartConfig.init`): "math" (the default) starts from the math default
model of the same seed (built or reused by `pipeline.workflows.math.model.default_model`, same
architecture and tokenizer), which already adds two-digit numbers in its own "12+45=" format;
"random" starts from random weights. The math model alone scores near zero on reasoning-gym's
texts ("Calculate 12 + 45."), but it learns them in far fewer steps than random weights do, which
makes the build minutes on a CPU (docs/results/reasoning-gym.md).

Warm start: SFT on train-split problems of the dataset (never a held-out question), every target
the dataset's reference answer: the Solver's question (share `mix_solver`), the blind Verifier's
"<question>\\nCheck it: work it out again." (`mix_verifier`), and the feedback strategy's second
attempt after "That is wrong. Try again." / "That is right. Say it again." (`mix_feedback`).
As the math model's warm start it stops at the first probe (the Solver at T=1 on `probe_size`
train problems, scored by the dataset) at or above `target_accuracy`, or at `max_steps`, so the
first round starts from a Solver that is sometimes right with room to improve. Deterministic
from the seed. `python -m pipeline.workflows.reasoning_gym.model dataset=NAME [options]` builds
(or reuses) one and prints its held-out accuracy.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from pipeline.errors import ConfigError
from pipeline.models.build import ModelConfig, cached_build, count_parameters, untrained_model
from pipeline.types import Message

__all__ = ["RGWarmStartConfig", "RG_BUILD_VERSION", "INITS", "warm_examples", "initial_model", "build_settings", "reasoning_gym_model", "main"]

RG_BUILD_VERSION = 2
"""Bump when the build code changes what it produces, so old cached models are not reused."""

INITS = ("math", "random")


@dataclass(frozen=True)
class RGWarmStartConfig:
    """Settings of the warm-start SFT (the math warm start's optimizer settings)."""

    batch_size: int = 128
    lr: float = 3e-3
    warmup_steps: int = 30
    max_steps: int = 1500
    """Hard cap on steps: a dataset the model cannot learn stops here, at its probe accuracy."""
    min_steps: int = 100
    probe_every: int = 25
    probe_size: int = 256
    target_accuracy: float = 0.35
    mix_solver: float = 0.6
    mix_verifier: float = 0.25
    mix_feedback: float = 0.15
    pool: int = 4000
    """Train-split items drawn once; the examples are sampled from them."""
    threads: int = 1
    """torch threads during the warm start (the grid model's choice: on a shared 2-core machine
    two threads waiting on each other ran many times slower than one)."""
    init: str = "math"
    """Initial weights: "math" (the math default model of the same seed) or "random"."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ConfigError(f"reasoning_gym warm_start.init must be one of {list(INITS)}, got {self.init!r}")
        for name in ("batch_size", "max_steps", "probe_every", "probe_size", "pool"):
            if getattr(self, name) < 1:
                raise ConfigError(f"reasoning_gym warm_start.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.target_accuracy <= 1:
            raise ConfigError(f"reasoning_gym warm_start.target_accuracy must be in (0, 1], got {self.target_accuracy}")


def warm_examples(task, pool: list, rng: random.Random, n: int, config: RGWarmStartConfig) -> list[tuple[list[Message], str]]:
    """`n` (messages, target) pairs of the mix in `config` on the train problems `pool`."""
    from pipeline.tasks.base import RIGHT_FEEDBACK, WRONG_FEEDBACK

    weights = [config.mix_solver, config.mix_verifier, config.mix_feedback]
    out = []
    for _ in range(n):
        p = rng.choice(pool)
        ref = task.reference(p)
        kind = rng.choices(range(3), weights)[0]
        if kind == 0:
            out.append((task.solver_messages(p), ref))
        elif kind == 1:
            out.append((task.verifier_messages(p, ref), ref))
        else:
            right = rng.random() < 0.3
            attempt = ref if right else task.reference(rng.choice(pool))  # another question's answer: a plausible miss
            right = right or attempt == ref
            msgs = [*task.solver_messages(p), Message(role="assistant", content=attempt), Message(role="user", content=RIGHT_FEEDBACK if right else WRONG_FEEDBACK)]
            out.append((msgs, ref))
    return out


def _warm_start(model, tok, task, config: RGWarmStartConfig, log: Callable[[str], None]) -> dict:
    import torch

    from pipeline.models.sft import sft_steps
    from pipeline.workflows.math.warmstart import solver_accuracy

    torch.manual_seed(config.seed)
    rng = random.Random(f"rg-warm-start:{config.seed}")
    stream = task.stream("train", seed=20_000 + config.seed)
    pool = [p for _, p in zip(range(config.pool), stream)]
    if not pool:
        raise ConfigError(f"reasoning_gym: dataset {task.dataset!r} gave no train problems to warm-start on")
    probe = [p for _, p in zip(range(config.probe_size), task.stream("train", seed=10_000 + config.seed))]
    steps = sft_steps(model, tok, lambda step: warm_examples(task, pool, rng, config.batch_size, config), steps=config.max_steps, lr=config.lr,
                      lr_lambda=lambda s: min(1.0, (s + 1) / max(1, config.warmup_steps)))
    t0, acc, loss_avg, step, history = time.perf_counter(), 0.0, math.nan, 0, []
    budget = task.default_max_tokens
    for step, loss in steps:
        loss_avg = loss if math.isnan(loss_avg) else 0.9 * loss_avg + 0.1 * loss
        if step % config.probe_every or step < config.min_steps:
            continue
        acc = solver_accuracy(model, tok, probe, task, temperature=1.0, seed=config.seed * 7919 + step, max_new_tokens=budget)
        history.append((step, acc))
        log(f"warm start: step {step:4d}/{config.max_steps}  loss {loss_avg:.3f}  solver T=1 score (train probe) {acc:6.1%}  {time.perf_counter() - t0:5.1f}s")
        if acc >= config.target_accuracy:
            break
    model.eval()
    return {"steps": step, "seconds": time.perf_counter() - t0, "probe_accuracy": acc, "stopped_early": acc >= config.target_accuracy, "history": history}


def initial_model(config: RGWarmStartConfig, model_config: ModelConfig, folder: Path, source: Path | None, log: Callable[[str], None] = print):
    """(tokenizer, model) the warm start begins from, saved into `folder` and loaded back: the
    model in `source` (`init` "math": the math default model) or random weights of
    `model_config` (`init` "random", `source` None)."""
    from pipeline.models import load_model, load_tokenizer
    from pipeline.workflows.math.model import build_tokenizer

    if source is None:
        return untrained_model(model_config, build_tokenizer(model_config), folder)
    log(f"starting from {source}")
    tok, model = load_tokenizer(source), load_model(source)
    tok.save_pretrained(str(folder))
    model.save_pretrained(str(folder), safe_serialization=True)
    return load_tokenizer(folder), load_model(folder)


def build_settings(task, config: RGWarmStartConfig, model_config: ModelConfig, source: Path | None) -> dict:
    """What the build's cache key hashes: the dataset, its options and split, the model, the warm
    start, the prompts it trains on, and the initial weights: the math model's folder, which is
    named by the hash of its own settings (so a new math build is a new reasoning-gym build)."""
    prompts = {k: getattr(task.prompts, k) for k in ("user", "verifier_user", "wrong_feedback", "right_feedback")}
    from pipeline.workflows.reasoning_gym.datasets import SPLIT_RULE

    # the split rule and reward are in the key too: with init=random nothing else changes with them
    settings = {"version": RG_BUILD_VERSION, "dataset": task.dataset, "options": task.options, "heldout_fraction": task.heldout_fraction,
                "split": SPLIT_RULE,
                "max_tokens": task.default_max_tokens, "model": model_config.key(), "warm_start": asdict(config), "prompts": prompts,
                "initial": Path(source).name if source is not None else "random"}
    settings["warm_start"].pop("threads")  # does not change the result
    return settings


def reasoning_gym_model(task, cache_dir: str | Path | None = None, config: RGWarmStartConfig | None = None, force: bool = False,
                        log: Callable[[str], None] = print) -> Path:
    """The warm-started model of `task` (a `ReasoningGymTask`): built on the first call for its
    dataset, options and held-out fraction, reused afterwards."""
    from pipeline.workflows.math.model import default_model
    from pipeline.workflows.math.warmstart import solver_accuracy

    config = config or RGWarmStartConfig()
    model_config = ModelConfig(seed=config.seed)
    source = None if config.init == "random" else default_model(cache_dir, seed=config.seed)
    settings = build_settings(task, config, model_config, source)

    def build(folder: Path) -> dict:
        import torch

        tok, model = initial_model(config, model_config, folder, source, log)
        log(f"reasoning-gym model for {task.dataset}: {count_parameters(model) / 1e6:.2f}M parameters; warm start on its train split")
        threads = torch.get_num_threads()
        torch.set_num_threads(config.threads)
        try:
            with torch.random.fork_rng(devices=[]):
                result = _warm_start(model, tok, task, config, log)
        finally:
            torch.set_num_threads(threads)
        model.save_pretrained(str(folder), safe_serialization=True)
        heldout = task.problems("heldout", min(200, _heldout_available(task)), seed=0)
        acc = {"heldout_acc_t1": solver_accuracy(model, tok, heldout, task, 1.0, 4, seed=0, max_new_tokens=task.default_max_tokens),
               "heldout_acc_greedy": solver_accuracy(model, tok, heldout, task, 0.0, 1, seed=0, max_new_tokens=task.default_max_tokens)}
        log(f"reasoning-gym model ready: {result['steps']} steps in {result['seconds']:.0f}s; held-out mean score at T=1 "
            f"{acc['heldout_acc_t1']:.1%}, greedy {acc['heldout_acc_greedy']:.1%} ({len(heldout)} problems)")
        return {"build_version": RG_BUILD_VERSION, **settings, "warm_start_result": result, "parameters": count_parameters(model), **acc}

    key = json.loads(json.dumps(settings, default=str))  # tuples and the like as JSON writes them
    return cached_build(cache_dir, f"reasoning-gym-{task.dataset}", key, build, what=f"the reasoning-gym model of {task.dataset}", force=force, log=log)


def _heldout_available(task, cap: int = 200) -> int:
    """How many distinct held-out questions the dataset has, up to `cap`: distinct up to their
    canonical form, as `problems()` draws them."""
    from pipeline.tasks.base import canonical_question

    seen = set()
    for _, p in zip(range(cap * 20), task.stream("heldout", seed=0)):
        seen.add(canonical_question(p.question))
        if len(seen) >= cap:
            break
    return len(seen)


def main(argv=None) -> int:
    from pipeline.config.flat import parse_options
    from pipeline.models import build_info
    from pipeline.workflows.reasoning_gym.datasets import ReasoningGymTask

    options = parse_options(sys.argv[1:] if argv is None else argv)
    if "dataset" not in options:
        raise SystemExit("usage: python -m pipeline.workflows.reasoning_gym.model dataset=NAME [its options as KEY=VALUE]")
    task = ReasoningGymTask(options.pop("dataset"), options)
    info = build_info(reasoning_gym_model(task))
    print(f"held-out mean score at T=1 {info['heldout_acc_t1']:.1%}, greedy {info['heldout_acc_greedy']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
