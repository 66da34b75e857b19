"""Precision: bf16 detected from the CPU's flags (never assumed), "auto" deciding per model size,
the `dtype` setting reaching the engines and the trainer, and a bf16-autocast training step on
the tiny model (float32 weights, float32 loss, close to the float32 step)."""

from __future__ import annotations

import argparse

import pytest
import torch

from pipeline.engines import config as ec
from pipeline.engines.config import BF16_MIN_PARAMETERS, EngineConfig, cpuinfo_has_bf16, model_parameters, resolve_dtype
from pipeline.errors import ConfigError
from pipeline.run.settings import Settings, add_setting_flags, settings_from_args
from pipeline.config.loss import LossConfig, RatioConfig
from pipeline.config.train import TrainConfig
from tiny import tiny_model_dir

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni
"""
SAPPHIRE_RAPIDS = "flags\t\t: fpu sse2 avx2 avx512f avx512bw amx_bf16 amx_tile amx_int8\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.fixture
def cpu(monkeypatch):
    """Set the CPU `cpu_has_bf16` sees: its /proc/cpuinfo text, an x86 machine, torch's oneDNN bf16 on."""

    def use(text: str | None, machine: str = "x86_64", torch_ok: bool = True):
        monkeypatch.setattr(ec, "_read_cpuinfo", lambda: text)
        monkeypatch.setattr(ec.platform, "machine", lambda: machine)
        monkeypatch.setattr(ec, "_torch_cpu_bf16", lambda: torch_ok)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    return use


def test_cpuinfo_flags_decide_native_bf16():
    assert cpuinfo_has_bf16(ZEN4) and cpuinfo_has_bf16(SAPPHIRE_RAPIDS)
    assert not cpuinfo_has_bf16(SKYLAKE)  # AVX512 without bf16: oneDNN would emulate it
    assert not cpuinfo_has_bf16(GRAVITON3)  # not an x86 flags line
    assert not cpuinfo_has_bf16("") and not cpuinfo_has_bf16("model name\t: avx512_bf16 lookalike\n")


@pytest.mark.parametrize(
    "text, machine, torch_ok, expected",
    [
        (ZEN4, "x86_64", True, "bfloat16"),
        (SAPPHIRE_RAPIDS, "x86_64", True, "bfloat16"),
        (SKYLAKE, "x86_64", True, "float32"),
        (None, "x86_64", True, "float32"),  # no /proc/cpuinfo (not Linux)
        (ZEN4, "x86_64", False, "float32"),  # torch's oneDNN cannot run bf16
        (GRAVITON3, "aarch64", True, "float32"),  # not detected: keeps float32
    ],
)
def test_auto_resolves_from_the_cpu_and_the_model_size(cpu, text, machine, torch_ok, expected):
    cpu(text, machine, torch_ok)
    real = BF16_MIN_PARAMETERS  # a real model: at the threshold
    assert ec.cpu_has_bf16() is (expected == "bfloat16")
    assert resolve_dtype("auto", real) == expected == EngineConfig().resolved_dtype(real)
    assert resolve_dtype("auto", None) == expected  # size unknown: the hardware decides
    assert resolve_dtype("auto", BF16_MIN_PARAMETERS - 1) == "float32"  # the tiny default model keeps float32
    assert EngineConfig(dtype="float32").resolved_dtype(real) == "float32"
    assert EngineConfig(dtype="bfloat16").resolved_dtype(10) == "bfloat16"  # explicit wins
    assert resolve_dtype("auto", 10, cuda=True) == "bfloat16"  # a GPU: bf16 as before
    with pytest.raises(ConfigError):
        resolve_dtype("fp8")


def test_model_parameters_are_read_from_the_weight_files(tmp_path):
    from pipeline.models import count_parameters, load_model

    d = tiny_model_dir(tmp_path / "m")
    assert model_parameters(d) == count_parameters(load_model(d)) < BF16_MIN_PARAMETERS
    assert model_parameters(tmp_path) is None


def test_the_engine_loads_the_resolved_dtype(cpu, tmp_path, monkeypatch):
    from pipeline.engines.hf import HFSampler

    cpu(ZEN4)
    d = tiny_model_dir(tmp_path / "m")
    auto = HFSampler(d, EngineConfig())
    assert auto.dtype == "float32" and auto.model.dtype == torch.float32  # below the threshold on a bf16 CPU
    bf16 = HFSampler(d, EngineConfig(dtype="bfloat16"))
    assert bf16.dtype == "bfloat16" and bf16.model.dtype == torch.bfloat16
    prompt = [[3, 10, 11, 12]]
    (sample,) = bf16.generate(prompt, n=1, temperature=1.0, max_tokens=4, seed=0)[0]
    assert len(sample.logprobs) == len(sample.token_ids) and all(lp <= 0 for lp in sample.logprobs)
    monkeypatch.setattr(ec, "BF16_MIN_PARAMETERS", 1)  # the tiny model counts as real
    assert HFSampler(d, EngineConfig()).dtype == "bfloat16"


def test_the_setting_reaches_the_engines_and_the_trainer():
    from assets.config import RunSettings
    from assets.resources import EngineResource, close_engines, engine_options

    assert Settings().dtype == "auto" and Settings().run_config().train.dtype == "auto"
    s = Settings(dtype="bfloat16")
    assert s.run_config().train.dtype == "bfloat16" and s.run_config().train.dtype == "bfloat16"
    options = engine_options(RunSettings.from_settings(s).run_config())
    assert options["dtype"] == "bfloat16" and EngineConfig(**options).dtype == "bfloat16"
    assert EngineResource(engine="hf").pool(options).options["dtype"] == "bfloat16"
    assert "dtype" not in engine_options(RunSettings().run_config())  # auto: the engines decide per model, as training does
    close_engines()
    parser = argparse.ArgumentParser()
    add_setting_flags(parser)
    assert settings_from_args(parser.parse_args(["--dtype", "float32"])).run_config().train.dtype == "float32"
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "fp8"])
    with pytest.raises(ConfigError, match="dtype"):
        Settings(dtype="fp8")
    with pytest.raises(ConfigError, match="TrainConfig.dtype"):
        TrainConfig(dtype="float16")


def _rows(n: int = 6):
    import random

    rng = random.Random(0)
    rows = []
    for i in range(n):
        c = rng.randint(2, 6)
        rows.append({
            "train_prompt_ids": [rng.randint(6, 200) for _ in range(rng.randint(3, 8))], "completion_ids": [rng.randint(6, 200) for _ in range(c)],
            "sampling_logprobs": [-5.5] * c, "advantage": rng.choice([-1.0, 1.0]), "sample_weight": 1.0, "reward": 1.0,
            "strategy": "iid", "agent_id": "solver", "step_id": f"r{i}",
        })
    return rows


def test_a_bf16_autocast_step_is_finite_close_to_fp32_and_keeps_fp32_weights(tmp_path, monkeypatch):
    from pipeline.models import load_model
    from pipeline.learn import trainer as tr

    d = tiny_model_dir(tmp_path / "m")
    batch = tr.collate(_rows())
    cfg = LossConfig(kind="ppo", ratio=RatioConfig(mode="none"))
    seen = []
    real_compute_loss = tr.loop.compute_loss
    monkeypatch.setattr(tr.loop, "compute_loss", lambda b, c, **k: seen.append(b.logp.dtype) or real_compute_loss(b, c, **k))
    out = {}
    for name, autocast in (("float32", None), ("bfloat16", torch.bfloat16)):
        model = load_model(d).train()
        loss = tr.batch_loss(model, batch, cfg, 1.0, autocast_dtype=autocast).loss
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert loss.dtype == torch.float32 and grads.dtype == torch.float32 and all(p.dtype == torch.float32 for p in model.parameters())
        out[name] = (loss.item(), grads)
    assert seen == [torch.float32, torch.float32]  # the ratios and the loss are float32 under autocast too
    assert torch.isfinite(torch.tensor(out["bfloat16"][0])) and out["bfloat16"][0] == pytest.approx(out["float32"][0], rel=2e-2)
    g32, g16 = out["float32"][1], out["bfloat16"][1]
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.99


def _view(model_dir, n: int = 8):
    """A training view of `n` rows sampled by the tiny model itself (on-policy logprobs)."""
    from pipeline.models import load_model, load_tokenizer
    from pipeline.models.chat import encode_prompt
    from pipeline.strategies import IID
    from pipeline.learn.trainer import collate, completion_logps
    from pipeline.learn.views import build_training_view
    from tiny import advantage_row, advantages_table

    tok, model = load_tokenizer(model_dir), load_model(model_dir)
    rows = []
    for i, r in enumerate(_rows(n)):
        msgs = [{"role": "user", "content": f"{10 + i}+{20 + i}="}]
        prompt = encode_prompt(tok, msgs)
        with torch.no_grad():
            lp = completion_logps(model, collate([{**r, "train_prompt_ids": prompt}]), 1.0)[0].tolist()
        rows.append(advantage_row(r["step_id"], sampling_messages=msgs, prompt_ids=prompt, completion_ids=r["completion_ids"],
                                  completion_logprobs=lp, advantage=r["advantage"], temperature=1.0))
    return build_training_view(advantages_table(rows), {"iid": IID()}, tok)[0]


def test_train_policy_in_bf16_records_the_resolved_dtype(tmp_path, cpu):
    from pipeline.learn.trainer import read_checkpoint_meta, train_policy

    cpu(ZEN4)
    d = tiny_model_dir(tmp_path / "m")
    view = _view(d)
    fast = dict(report_to="none", temperature=1.0, minibatch_size=4, micro_batch_size=2, epochs=1)
    auto = train_policy(view, "shared", d, tmp_path / "auto", TrainConfig(loss=LossConfig(kind="ppo"), **fast))
    assert auto.dtype == "float32" and read_checkpoint_meta(auto.checkpoint).config["dtype"] == "float32"  # tiny: below the threshold
    assert abs(auto.first_step_diagnostics.overall.mean_log_ratio) < 1e-5
    bf16 = train_policy(view, "shared", d, tmp_path / "bf16", TrainConfig(loss=LossConfig(kind="ppo"), **fast, dtype="bfloat16"))
    meta = read_checkpoint_meta(bf16.checkpoint)
    assert bf16.dtype == "bfloat16" and meta.config["dtype"] == "bfloat16" and meta.metrics["bf16"] == 1.0
    assert bf16.steps == 2 and bf16.mean_loss == pytest.approx(auto.mean_loss, rel=2e-2, abs=1e-3)
    assert 0 < abs(bf16.first_step_diagnostics.overall.mean_log_ratio) < 0.05  # bf16 rounding, against float32 logprobs
    override = train_policy(view, "shared", d, tmp_path / "override", TrainConfig(loss=LossConfig(kind="ppo"), **fast, dtype="bfloat16", bf16=False))
    assert override.dtype == "float32" and read_checkpoint_meta(override.checkpoint).config["dtype"] == "float32"
