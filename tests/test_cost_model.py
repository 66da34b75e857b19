"""scripts/cost_model.py: the round cost model (pure arithmetic, no engines)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cost_model.py"

_spec = importlib.util.spec_from_file_location("cost_model", SCRIPT)
cm = importlib.util.module_from_spec(_spec)
sys.modules["cost_model"] = cm
_spec.loader.exec_module(cm)

COUNTS = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1024]


@pytest.mark.parametrize(
    "params, gpu, budget",
    [(135e6, "h100", "gsm8k"), (7e9, "h100", "gsm8k"), (7e9, "a100", "default"), (70e9, "h100", "gsm8k"), (1.09e6, "l4", "default")],
)
def test_more_gpus_never_slow_rollouts_down(params, gpu, budget):
    hw, b = cm.HARDWARE[gpu], cm.BUDGETS[budget]
    times = [cm.round_cost(params, g, hw, b).rollouts.seconds for g in COUNTS]
    finite = [t for t in times if math.isfinite(t)]
    assert finite, "the model never fits"
    for a, c in zip(times, times[1:]):
        assert c <= a * (1 + 1e-12), times
    # the first engines help; the last ones hit the latency floor (the longest completion)
    assert finite[-1] < finite[0]
    first = next(i for i, t in enumerate(times) if math.isfinite(t))
    assert times[first + 1] < times[first]


def test_rollouts_stop_scaling_at_the_latency_floor():
    """With one sequence per engine call, more engines cannot help: the longest completion sets it."""
    hw, b = cm.HARDWARE["h100"], cm.BUDGETS["gsm8k"]
    many = cm.round_cost(7e9, 1000, hw, b)
    more = cm.round_cost(7e9, 4000, hw, b)
    assert more.rollouts.seconds > 0.9 * many.rollouts.seconds
    assert "longest completion" in cm.round_cost(70e9, 1000, hw, b).rollouts.bound


def test_the_bottleneck_moves_from_one_node_to_many():
    hw, b = cm.HARDWARE["h100"], cm.BUDGETS["gsm8k"]
    one_node = cm.round_cost(7e9, 8, hw, b).bottleneck
    many = cm.round_cost(7e9, 1000, hw, b).bottleneck
    assert one_node.startswith("rollouts: decode")
    assert many.startswith("training: FSDP")
    assert "caps data parallel" in many


def test_what_does_not_fit_is_infinite_and_says_why():
    hw, b = cm.HARDWARE["h100"], cm.BUDGETS["gsm8k"]
    c = cm.round_cost(70e9, 2, hw, b)
    assert math.isinf(c.rollouts.seconds) and "tensor parallel 4" in c.rollouts.bound
    c = cm.round_cost(7e9, 1, hw, b)  # 7B x 16 bytes of training state > one 80 GB device
    assert math.isfinite(c.rollouts.seconds) and math.isinf(c.training.seconds)
    assert "needs >= 2 devices" in c.training.bound
    assert cm.round_cost(70e9, 8, hw, b).tp == 4


def test_formulas_scale_as_stated():
    hw = cm.HARDWARE["h100"]
    b = cm.BUDGETS["gsm8k"]
    # training is FLOP bound on one node: twice the parameters, twice the seconds
    t7 = cm.round_cost(7e9, 8, hw, b, shape=cm.Shape(7e9, 32, 4096, 1.0, "x")).training.seconds
    t14 = cm.round_cost(14e9, 8, hw, b, shape=cm.Shape(14e9, 32, 4096, 1.0, "x")).training.seconds
    assert t14 == pytest.approx(2 * t7)
    # store I/O is linear in the bytes per row
    s1 = cm.round_cost(7e9, 8, hw, b).tables.seconds
    s2 = cm.round_cost(7e9, 8, hw, replace(b, bytes_per_token=2 * b.bytes_per_token)).tables.seconds
    assert s2 > s1
    # weight sync is the model's bytes over the link
    assert cm.round_cost(7e9, 8, hw, b).sync.seconds == pytest.approx(7e9 * 2 / hw.link_bw)
    assert cm.round_cost(7e9, 64, hw, b).sync.seconds == pytest.approx(7e9 * 2 / hw.net_bw)


def test_cpu_calibration_reproduces_the_measured_rates():
    rows = cm.calibration()
    for m in rows:
        ratio = m.predicted / m.value
        if m.role == "fitted":
            assert 1 / 1.25 <= ratio <= 1.25, (m.what, m.setting, m.predicted, m.value)
        elif m.role == "predicted":
            assert 1 / cm.CALIBRATION_FACTOR <= ratio <= cm.CALIBRATION_FACTOR, (m.what, m.setting, m.predicted, m.value)
        else:
            assert m.role == "outside" and "under-predicted" in m.setting, m
    assert sum(m.role == "predicted" for m in rows) >= 3


def test_the_cpu_computes_at_its_measured_matmul_rates_in_the_dtype_a_run_picks():
    from pipeline.engines.config import BF16_MIN_PARAMETERS

    cpu = cm.HARDWARE["cpu"]
    assert (cpu.peak_flops, cpu.dtype_bytes) == (216e9, 4) and (cm.CPU_BF16.peak_flops, cm.CPU_BF16.dtype_bytes) == (861e9, 2)
    assert cm.for_model(cpu, BF16_MIN_PARAMETERS - 1) is cpu
    assert cm.for_model(cpu, BF16_MIN_PARAMETERS) is cm.CPU_BF16
    assert cm.for_model(cm.HARDWARE["h100"], 7e9) is cm.HARDWARE["h100"]
    b = cm.BUDGETS["gsm8k"]
    below = cm.round_cost(BF16_MIN_PARAMETERS - 1, 1, cpu, b).training.seconds
    at = cm.round_cost(BF16_MIN_PARAMETERS, 1, cpu, b).training.seconds
    speedup = (861e9 * cm.CPU_BF16.train_mfu) / (216e9 * cpu.train_mfu)
    assert below / at == pytest.approx(speedup, rel=1e-6)
    # the engine serves and syncs bf16 weights: half the bytes of fp32
    assert cm.round_cost(BF16_MIN_PARAMETERS, 1, cpu, b).sync.seconds == pytest.approx(2 * 2 * BF16_MIN_PARAMETERS / cpu.disk_bw)


def test_budget_and_shape_errors_name_the_field():
    with pytest.raises(ConfigError, match="samples"):
        cm.Budget(samples=0)
    with pytest.raises(ConfigError, match="train_fraction"):
        cm.Budget(train_fraction=1.5)
    with pytest.raises(ConfigError, match="completion_tokens"):
        cm.Budget(completion_tokens=600, max_tokens=512)
    with pytest.raises(ConfigError, match="gpus"):
        cm.round_cost(7e9, 0, cm.HARDWARE["h100"])
    with pytest.raises(ConfigError, match="--params"):
        cm.parse_params("seven")
    assert cm.parse_params("135M") == 135e6 and cm.parse_params("7B") == 7e9 and cm.parse_params("1.09e6") == 1.09e6


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--gpus", "0"], "--gpus"),
        (["--gpu", "tpu"], "--gpu"),
        (["--params", "lots"], "--params"),
        (["--budget", "huge"], "--budget"),
        (["--sweep", "0", "8"], "--sweep"),
        (["--samples", "0"], "samples"),
        (["--budget", "gsm8k", "--completion-tokens", "600"], "completion_tokens"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cm.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err


def test_command_line_prints_the_round_and_the_sweep():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--params", "7B", "--gpus", "8", "--gpu", "h100", "--budget", "gsm8k", "--sweep", "1", "8", "1000"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for word in ("rollouts", "training", "sync", "tables", "evaluation", "bottleneck", "1000", "assumed h100"):
        assert word in out.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--gpus", "-3"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "--gpus" in bad.stderr


def test_overlapped_rounds_take_the_slower_lane_of_the_best_split():
    hw = cm.for_model(cm.HARDWARE["h100"], 7e9)
    budget = cm.BUDGETS["gsm8k"]
    assert cm.overlapped_round(7e9, 1, hw, budget) is None  # one device: no split to price
    lanes = cm.overlapped_round(7e9, 8, hw, budget)
    assert lanes.sampler_gpus + lanes.trainer_gpus == 8 and lanes.total == max(lanes.sampler, lanes.trainer)
    for g in range(1, 8):  # no other split is faster
        other = cm.round_cost(7e9, g, hw, budget), cm.round_cost(7e9, 8 - g, hw, budget)
        sampler = other[0].rollouts.seconds + other[0].tables.seconds + other[0].evaluation.seconds
        assert max(sampler, other[1].training.seconds + other[1].sync.seconds) >= lanes.total
