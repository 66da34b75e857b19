"""Trainer throughput against a plain PyTorch loop, measured in the same run.

Both train the same rows of a synthetic training view (arithmetic-sized prompts and completions)
on the same model (the prototype's size: 4 layers, width 128, ~1M parameters), with the same loss
(`pipeline.learn.loss`, through `batch_loss`), the same collation and the same AdamW settings,
for one epoch each. Runs alternate (plain, trainer, plain, trainer, ...) so background load hits
both alike; the best of each is reported. Goal: trainer >= 80% of the plain loop's tokens/s.

    .venv/bin/python benchmarks/training.py [--rows 1024] [--minibatch 64] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

from pipeline.models.chat import encode_prompt  # noqa: E402
from pipeline.strategies import IID  # noqa: E402
from pipeline.config.loss import LossConfig  # noqa: E402
from pipeline.config.train import TrainConfig  # noqa: E402
from pipeline.learn.trainer import batch_loss, collate, set_threads, train_policy  # noqa: E402
from pipeline.learn.views import build_training_view, to_dataset  # noqa: E402
from tiny import advantage_row, advantages_table, tiny_model_dir, tiny_tokenizer  # noqa: E402


def synthetic_view(tok, n: int, seed: int = 0, half_rewarded: bool = False):
    """`n` arithmetic-sized rows with random advantages +-1; with `half_rewarded`, every other row
    is rewarded (reward 1, advantage +1) and the rest not (reward 0, advantage -1)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"{rng.randint(10, 999)}+{rng.randint(10, 999)}="}]
        completion = [rng.randint(20, 60) for _ in range(rng.randint(3, 5))] + [1]
        logprobs = [rng.uniform(-6.0, -5.0) for _ in completion]
        if half_rewarded:
            right = i % 2 == 0
            extra = {"reward": float(right), "local_reward": float(right), "advantage": 1.0 if right else -1.0}
        else:
            extra = {"advantage": rng.choice([-1.0, 1.0])}
        rows.append(
            advantage_row(
                f"r{i}",
                sampling_messages=msgs,
                prompt_ids=encode_prompt(tok, msgs),
                completion_ids=completion,
                completion_logprobs=logprobs,
                **extra,
            )
        )
    return build_training_view(advantages_table(rows), {"iid": IID()}, tok)[0]


def cpu_clock_callback():
    """A TrainerCallback recording the process CPU time of the training loop."""
    from transformers import TrainerCallback

    class CpuClock(TrainerCallback):
        seconds = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self._t0 = time.process_time()

        def on_train_end(self, args, state, control, **kwargs):
            self.seconds = time.process_time() - self._t0

    return CpuClock()


def plain_loop(view, init_dir: Path, config: TrainConfig, pad_id: int) -> tuple[float, float, int]:
    """One epoch of the same training as a bare PyTorch loop; returns (wall s, CPU s, completion tokens)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    loader = torch.utils.data.DataLoader(
        to_dataset(view), batch_size=config.micro_batch_size, shuffle=True, generator=gen, collate_fn=lambda r: collate(r, pad_id)
    )
    accum = config.grad_accum_steps
    tokens = 0
    c0, t0 = time.process_time(), time.perf_counter()
    for i, batch in enumerate(loader):
        loss = batch_loss(model, batch, config.loss, config.temperature).loss / accum
        loss.backward()
        tokens += int(batch["completion_mask"].sum())
        if (i + 1) % accum == 0 or i + 1 == len(loader):
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, time.process_time() - c0, tokens


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """The options every training benchmark takes: --rows, --repeats, --threads."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the cores)")
    return ap


@contextlib.contextmanager
def bench_setup(args, half_rewarded: bool = False):
    """Torch threads, a temporary folder with the 0.66M-parameter model, its tokenizer and the
    synthetic view: yields (threads, tmp, init_dir, tok, view)."""
    threads = set_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        init_dir = tiny_model_dir(tmp / "base", hidden=128, layers=4)
        tok = tiny_tokenizer()
        yield threads, tmp, init_dir, tok, synthetic_view(tok, args.rows, half_rewarded=half_rewarded)


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--minibatch", type=int, default=64)
    ap.add_argument("--micro", type=int, default=64)
    args = ap.parse_args()
    with bench_setup(args) as (threads, tmp, init_dir, tok, view):
        config = TrainConfig(
            epochs=1, minibatch_size=args.minibatch, micro_batch_size=args.micro, report_to="none", num_threads=threads,
            loss=LossConfig(kind="ppo"), micro_batch_tokens=None, gradient_checkpointing=False,
        )
        n_params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(init_dir).parameters())
        plain, trainer, plain_cpu, trainer_cpu = [], [], [], []
        for r in range(args.repeats):
            secs, cpu, toks = plain_loop(view, init_dir, config, tok.pad_token_id)
            plain.append(toks / secs)
            plain_cpu.append(toks / cpu)
            clock = cpu_clock_callback()
            result = train_policy(view, "shared", init_dir, tmp / f"ckpt{r}", config, callbacks=[clock])
            trainer.append(result.tokens_per_second)
            trainer_cpu.append(result.completion_tokens / clock.seconds)
            print(
                f"repeat {r}: plain {toks / secs:7.0f} tok/s ({secs:.2f} s wall, {cpu:.2f} s CPU)   "
                f"trainer {result.tokens_per_second:7.0f} tok/s ({result.train_seconds:.2f} s wall, {clock.seconds:.2f} s CPU, {result.steps} steps)"
            )
        print(
            f"\nrows {args.rows}, completion tokens/epoch {toks}, model {n_params / 1e6:.2f}M params, "
            f"minibatch {args.minibatch}, micro-batch {args.micro}, threads {threads}"
        )
        print(f"plain PyTorch loop: {max(plain):7.0f} completion tokens/s wall, {max(plain_cpu):7.0f} per CPU-second (best of {args.repeats})")
        print(f"maxit trainer:      {max(trainer):7.0f} completion tokens/s wall, {max(trainer_cpu):7.0f} per CPU-second (best of {args.repeats})")
        print(f"ratio trainer/plain: {max(trainer) / max(plain):.1%} wall, {max(trainer_cpu) / max(plain_cpu):.1%} CPU (goal >= 80%)")


if __name__ == "__main__":
    main()
