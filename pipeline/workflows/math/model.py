"""The math workflows' embedded default model: a tokenizer trained on the arithmetic task's
formats and a tiny Llama, built in code (no download), warm-started on the task
(`warmstart.py`) and cached under `<cache>/models/default-<hash of every build setting>`.

- `default_model(cache_dir=None) -> Path`: build + warm-start the default model once, then reuse it.
- `build_default_model(cache_dir=None, seed=0, ...) -> Path`: the same with every knob, for the CLI.
- `python -m pipeline.workflows.math.model`: build (or reuse) it and print its held-out accuracy.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from pipeline.models import build_info, load_model, load_tokenizer
from pipeline.models.build import ModelConfig, cached_build, count_parameters, settings_key, untrained_model
from pipeline.models.tokenizer import train_tokenizer
from pipeline.workflows.math.warmstart import WarmStartConfig, solver_accuracy, warm_start

__all__ = ["BUILD_VERSION", "tokenizer_corpus", "build_tokenizer", "evaluate_solver", "build_default_model", "default_model", "main"]

BUILD_VERSION = 1
"""Bump when the build code changes what it produces, so old cached models are not reused."""


def tokenizer_corpus(seed: int = 0, n: int = 2000) -> list[str]:
    """Texts of every format of the default task (questions with answers, hints, Verifier
    prompts, feedback turns) on train-split problems, from which the BPE learns its merges (a
    held-out answer is not seen even as a merge)."""
    from pipeline.strategies import HINT_PREFIX
    from pipeline.tasks.arithmetic import ArithmeticTask, make_hint
    from pipeline.tasks.base import RIGHT_FEEDBACK, WRONG_FEEDBACK

    task = ArithmeticTask()
    rng = random.Random(f"tokenizer-corpus:{seed}")
    out: list[str] = []
    problems = 0
    while problems < n:
        a, op, b = task.sample_operands(rng)
        if task.split_of(a, op, b) != "train":
            continue
        problems += 1
        p = task.make_problem(a, op, b)
        out.append(p.question + p.answer)
        out.append(task.verifier_messages(p, p.answer)[0]["content"])
        for kind in ("tens", "prefix"):
            out.append(HINT_PREFIX + str(make_hint(int(p.answer), kind)))
    out += [WRONG_FEEDBACK, RIGHT_FEEDBACK, "yes", "no"] * 50
    return out


def build_tokenizer(config: ModelConfig = ModelConfig()):
    """The default model's tokenizer (`pipeline.models.tokenizer`), trained on `tokenizer_corpus`."""
    return train_tokenizer(tokenizer_corpus(config.seed), config.tokenizer)


def _build_settings(model_config: ModelConfig, warm_config: WarmStartConfig) -> dict:
    """What the default model's cache key hashes (`pipeline.models.build.settings_key`)."""
    from pipeline.tasks.arithmetic import SPLIT_RULE, ArithmeticConfig
    from pipeline.tasks.prompts import ARITHMETIC_PROMPTS

    # the texts the warm start renders are part of what the model is trained on: a change to them
    # is a new model (other template fields, e.g. how a verdict is read, are not)
    trained = ("user", "system", "verifier_user", "verifier_system", "wrong_feedback", "right_feedback")
    prompts = {name: getattr(ARITHMETIC_PROMPTS, name) for name in trained}
    # the warm start and the tokenizer see only the task's train split: a new split is a new model
    split = {"rule": SPLIT_RULE, "heldout_fraction": ArithmeticConfig().heldout_fraction}
    settings = {"version": BUILD_VERSION, "model": model_config.key(), "warm_start": asdict(warm_config), "prompts": prompts, "split": split}
    settings["warm_start"].pop("threads", None)  # does not change the result
    return settings


def _build_key(model_config: ModelConfig, warm_config: WarmStartConfig) -> str:
    return settings_key(_build_settings(model_config, warm_config))


def evaluate_solver(model_dir: str | Path, n: int = 400, samples: int = 4, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy of a model's Solver on the default task: T=1 without and with the hint
    (`samples` each of `n` problems; standard error ~1 point at the defaults) and greedy. 400:
    the held-out split holds 459 distinct sums (a+b and b+a are one)."""
    from pipeline.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    tok, model = load_tokenizer(model_dir), load_model(model_dir)
    problems = task.problems("heldout", n, seed=seed)
    return {
        "heldout_acc_t1": solver_accuracy(model, tok, problems, task, 1.0, samples, hint=False, seed=seed),
        "heldout_acc_t1_hint": solver_accuracy(model, tok, problems, task, 1.0, samples, hint=True, seed=seed + 1),
        "heldout_acc_greedy": solver_accuracy(model, tok, problems, task, 0.0, 1, hint=False, seed=seed),
    }


def build_default_model(
    cache_dir: str | Path | None = None,
    seed: int = 0,
    model_config: ModelConfig | None = None,
    warm_config: WarmStartConfig | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Build the default tokenizer and model, warm-start it, measure its held-out accuracy, and
    save it under `<cache_dir>/models/default-<hash of the settings>` (atomically; an existing
    build with the same settings is reused unless `force`). Returns the model dir."""
    model_config = model_config or ModelConfig(seed=seed)
    warm_config = warm_config or WarmStartConfig(seed=seed)

    def build(folder: Path) -> dict:
        import torch

        t0 = time.perf_counter()
        tok, model = untrained_model(model_config, build_tokenizer(model_config), folder)
        log(f"tokenizer: {len(tok)} tokens; model: Llama {model_config.num_layers}x{model_config.hidden_size}, "
            f"{count_parameters(model) / 1e6:.2f}M parameters")
        with torch.random.fork_rng(devices=[]):
            result = warm_start(model, tok, warm_config, log=log)
        model.save_pretrained(str(folder), safe_serialization=True)
        log(f"warm start: {result.steps} steps in {result.seconds:.0f}s; measuring held-out accuracy")
        acc = evaluate_solver(folder)
        log(f"default model ready in {time.perf_counter() - t0:.0f}s: held-out accuracy at T=1 "
            f"{acc['heldout_acc_t1']:.1%} without hint, {acc['heldout_acc_t1_hint']:.1%} with hint "
            f"({acc['heldout_acc_greedy']:.1%} greedy)")
        return {
            "build_version": BUILD_VERSION,
            "model_config": asdict(model_config),
            "warm_start_config": asdict(warm_config),
            "warm_start": asdict(result),
            "parameters": count_parameters(model),
            "vocab_size": len(tok),
            **acc,
        }

    settings = _build_settings(model_config, warm_config)
    return cached_build(cache_dir, "default", settings, build, what=f"the default model (seed {seed})", force=force, log=log)


def default_model(cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """The warm-started default model dir: built on the first call, reused afterwards."""
    return build_default_model(cache_dir, seed=seed)



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.workflows.math.model", description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None, help="default: the project's cache folder (pipeline.store.cache_root)")
    ap.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    args = ap.parse_args(argv)
    path = build_default_model(args.cache_dir, seed=args.seed, force=args.force)
    info = build_info(path)
    ws = info["warm_start"]
    print(f"model: {path}")
    print(f"  {info['parameters'] / 1e6:.2f}M parameters, vocab {info['vocab_size']}, warm start {ws['steps']} steps "
          f"in {ws['seconds']:.0f}s")
    print(f"  held-out Solver accuracy at T=1: {info['heldout_acc_t1']:.1%} without hint, "
          f"{info['heldout_acc_t1_hint']:.1%} with hint; greedy {info['heldout_acc_greedy']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
