"""The trainer on the tiny model: on-policy ratio 1 through the real forward, parameters move,
context-swapped batches, stratified weights and the rs loss reaching the gradient, atomic
checkpoints under a crash, bad input named, and TRL's GRPO loss pinned to loss.py."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from pipeline.errors import ConfigError, DataError
from pipeline.models.chat import encode_prompt
from pipeline.store import jsonable
from pipeline.strategies import IID, PromptAug, Strategy
from pipeline.config.loss import LossConfig, RatioConfig
from pipeline.config.train import LoraSettings, TrainConfig
from pipeline.learn.trainer import (
    CHECKPOINT_META,
    OPTIMIZER_STATE,
    PolicyRows,
    TrainerRun,
    batch_loss,
    checkpoint_meta,
    checkpoint_metrics,
    collate,
    minibatch_count,
    completion_logps,
    max_train_length,
    read_checkpoint_meta,
    select_policy_rows,
    throughput,
    train_from_files,
    train_policy,
    train_result,
    training_arguments,
    visit_range,
)
from pipeline.learn.views import build_training_view, to_dataset, view_hash
from schemas import SchemaError
from tiny import advantage_row, advantages_table, tiny_model_dir

T = 0.7  # sampling temperature of every test row
FAST = dict(report_to="none", temperature=T, minibatch_size=8, micro_batch_size=4, epochs=1)


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "base")


@pytest.fixture(scope="module")
def tok(init_dir):
    return AutoTokenizer.from_pretrained(init_dir)


@pytest.fixture(scope="module")
def model(init_dir):
    return AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32).eval()


def unpadded_logps(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """log p(completion | prompt) from one forward over the row alone (no padding, no batching)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float() / temperature
        lp = torch.log_softmax(logits, dim=-1)
    return [lp[len(prompt) - 1 + t, tok].item() for t, tok in enumerate(completion)]


def rows_for(tok, model, n: int, strategy: str = "iid", hint: bool = False, seed: int = 0, **overrides) -> list[dict]:
    """n advantages rows whose logprobs are those of `model` at T under their sampling context."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question = {"role": "user", "content": f"{rng.randint(10, 99)}+{rng.randint(10, 99)}="}
        msgs = ([{"role": "system", "content": "Hint: add the tens first"}] if hint else []) + [question]
        prompt = encode_prompt(tok, msgs)
        completion = [rng.randint(20, 60) for _ in range(rng.randint(2, 6))] + [1]
        values = dict(
            strategy=strategy,
            sampling_messages=msgs,
            prompt_ids=prompt,
            completion_ids=completion,
            completion_logprobs=unpadded_logps(model, prompt, completion, T),
            advantage=rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5),
            reward=float(rng.random() < 0.5),
            temperature=T,
        )
        values.update(overrides)
        rows.append(advantage_row(f"{strategy}-{seed}-{i}", **values))
    return rows


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_on_policy_ratio_is_one_through_the_trainer_forward_and_params_move(tok, model, init_dir, tmp_path):
    view, _ = build_training_view(advantages_table(rows_for(tok, model, 8)), {"iid": IID()}, tok)
    # the collated, left/right-padded batch scores every token as the row alone does
    batch = collate(to_dataset(view).to_list(), tok.pad_token_id)
    with torch.no_grad():
        logp = completion_logps(model, batch, T)
    diff = ((logp - batch["sampling_logprobs"]) * batch["completion_mask"]).abs().max().item()
    assert diff < 1e-5

    # one optimizer step of the real run: its forward sees the initial weights
    result = train_policy(view, "shared", init_dir, tmp_path / "ckpt", TrainConfig(loss=LossConfig(kind="ppo"), **FAST))
    overall = result.diagnostics.overall
    assert result.steps == 1 and overall.n_rows == 8
    assert abs(overall.mean_log_ratio) < 1e-5
    assert overall.ess_fraction == pytest.approx(1.0, abs=1e-6)
    assert overall.clip_fraction == 0.0 and overall.masked_fraction == 0.0

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    before, after = params(model), params(trained)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert AutoTokenizer.from_pretrained(tmp_path / "ckpt")("1+2=")["input_ids"] == tok("1+2=")["input_ids"]
    meta = read_checkpoint_meta(tmp_path / "ckpt")
    assert (meta.round, meta.policy_id, meta.parent, meta.n_rows) == (0, "shared", str(init_dir), 8)
    assert meta.data_hash == view_hash(view) == result.data_hash
    assert meta.metrics["ratio/ess_fraction"] == pytest.approx(1.0, abs=1e-6)


@dataclass(frozen=True)
class SwapTo99(Strategy):
    strategy_id: ClassVar[str] = "swap"

    def training_messages(self, sampling_messages, turn, agent_id):
        return [{"role": "user", "content": "99"}]


def test_context_swap_scores_the_action_under_the_new_context(tok, model):
    # ob -> [9, 9]-style swap through the real forward: the action's logprobs are computed under
    # the training context, the stored ones stay the sampled ones
    msgs = [{"role": "user", "content": "123"}]
    adv = advantages_table(
        [advantage_row("s", strategy="swap", sampling_messages=msgs, prompt_ids=encode_prompt(tok, msgs), completion_ids=[40, 41], completion_logprobs=[-0.1, -0.2])]
    )
    view, _ = build_training_view(adv, {"swap": SwapTo99()}, tok)
    train_prompt = encode_prompt(tok, [{"role": "user", "content": "99"}])
    batch = collate(to_dataset(view).to_list(), tok.pad_token_id)
    assert torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)[0].tolist() == train_prompt + [40, 41]
    with torch.no_grad():
        logp = completion_logps(model, batch, T)[0].tolist()
    assert logp == pytest.approx(unpadded_logps(model, train_prompt, [40, 41], T), abs=1e-6)
    assert batch["sampling_logprobs"][0].tolist() == pytest.approx([-0.1, -0.2], abs=1e-7)


def test_context_swapped_batch_gives_finite_loss_and_diagnostics(tok, model, init_dir, tmp_path):
    rows = rows_for(tok, model, 6, strategy="prompt_aug", hint=True, seed=1) + rows_for(tok, model, 2, strategy="iid", seed=2)
    view, _ = build_training_view(advantages_table(rows), {"iid": IID(), "prompt_aug": PromptAug()}, tok)
    assert view.column("context_swapped").to_pylist() == [True] * 6 + [False] * 2
    cfg = TrainConfig(**FAST, loss=LossConfig(kind="ppo", ratio_by_strategy={"prompt_aug": RatioConfig(mode="truncate")}))
    result = train_policy(view, "shared", init_dir, tmp_path / "ckpt", cfg)
    assert math.isfinite(result.mean_loss)
    aug, iid = result.diagnostics.by_strategy["prompt_aug"], result.diagnostics.by_strategy["iid"]
    assert aug.n_rows == 6 and iid.n_rows == 2
    assert aug.mean_log_ratio != 0.0 and abs(iid.mean_log_ratio) < 1e-5
    assert aug.masked_fraction == 0.0  # truncation never masks
    assert 0 < aug.ess <= 6
    meta = json.loads((tmp_path / "ckpt" / CHECKPOINT_META).read_text())
    for key in ("mean_log_ratio", "clip_fraction", "masked_fraction", "truncated_fraction", "ess_fraction"):
        assert f"strategy/prompt_aug/{key}" in meta["metrics"]
        assert f"agent/solver/{key}" in meta["metrics"]


def _grads(model, batch, cfg) -> torch.Tensor:
    model.zero_grad()
    batch_loss(model, batch, cfg, T).loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_stratified_weights_scale_the_model_gradient(tok, model):
    # the expert-iteration plan's second test at model level: w_s = (0.75 iid, 0.25 prompt_aug), sample_weight = w_s * N / n_s
    rows = rows_for(tok, model, 2, strategy="iid", seed=3) + rows_for(tok, model, 4, strategy="prompt_aug", hint=True, seed=4)
    w_s, n_s, n = {"iid": 0.75, "prompt_aug": 0.25}, {"iid": 2, "prompt_aug": 4}, 6
    for r in rows:
        r["sample_weight"] = w_s[r["strategy"]] * n / n_s[r["strategy"]]
    view, _ = build_training_view(advantages_table(rows), {"iid": IID(), "prompt_aug": PromptAug()}, tok)
    items = to_dataset(view).to_list()
    cfg = LossConfig(kind="ppo", aggregation="seq-mean-token-sum", ratio=RatioConfig(mode="none"))
    model.train()
    try:
        g_all = _grads(model, collate(items, tok.pad_token_id), cfg)
        per_row = []
        for it in items:
            g = _grads(model, collate([{**it, "sample_weight": 1.0}], tok.pad_token_id), cfg)
            per_row.append(it["sample_weight"] * g)
    finally:
        model.zero_grad()
        model.eval()
    expected = torch.stack(per_row).sum(0) / n  # (1/N) sum_i w_i g_i
    assert torch.allclose(g_all, expected, atol=1e-6, rtol=1e-4)
    assert [it["sample_weight"] for it in items] == pytest.approx([2.25, 2.25, 0.375, 0.375, 0.375, 0.375])


def test_rs_loss_ignores_rows_below_threshold_in_the_gradient(tok, model):
    rows = rows_for(tok, model, 4, seed=5)
    rows[0]["reward"], rows[1]["reward"], rows[2]["reward"], rows[3]["reward"] = 1.0, 0.0, 1.0, 0.0
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok)
    items = to_dataset(view).to_list()
    cfg = LossConfig(kind="rs")
    model.train()
    try:
        g_all = _grads(model, collate(items, tok.pad_token_id), cfg)
        g_pass = _grads(model, collate([items[0], items[2]], tok.pad_token_id), cfg)
    finally:
        model.zero_grad()
        model.eval()
    assert torch.allclose(g_all, g_pass, atol=1e-7)
    assert g_all.abs().sum() > 0


class Boom(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise RuntimeError("boom after step 1")


def test_crash_mid_training_leaves_previous_checkpoint_and_no_partial_dir(tok, model, init_dir, tmp_path):
    view, _ = build_training_view(advantages_table(rows_for(tok, model, 16, seed=6)), {"iid": IID()}, tok)
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "previous.txt").write_text("round 0 checkpoint")
    with pytest.raises(RuntimeError, match="boom"):
        train_policy(view, "shared", init_dir, out, TrainConfig(loss=LossConfig(kind="ppo"), **FAST), callbacks=[Boom()])
    assert sorted(p.name for p in out.iterdir()) == ["previous.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary siblings left
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError, match="boom"):
        train_policy(view, "shared", init_dir, fresh, TrainConfig(loss=LossConfig(kind="ppo"), **FAST), callbacks=[Boom()])
    assert not fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_bad_view_input_names_column_and_step_id(tok, model, init_dir, tmp_path):
    view, _ = build_training_view(advantages_table(rows_for(tok, model, 3, seed=7)), {"iid": IID()}, tok)
    with pytest.raises(SchemaError, match="sampling_logprobs"):
        train_policy(view.drop_columns(["sampling_logprobs"]), "shared", init_dir, tmp_path / "a", TrainConfig(loss=LossConfig(kind="ppo"), **FAST))
    lp = view.column("sampling_logprobs").to_pylist()
    lp[1] = lp[1][:-1]
    broken = view.set_column(view.schema.get_field_index("sampling_logprobs"), "sampling_logprobs", pa.array(lp, pa.list_(pa.float32())))
    bad_id = view.column("step_id")[1].as_py()
    with pytest.raises(DataError, match=rf"'completion_ids'.*'sampling_logprobs'.*'{bad_id}'"):
        train_policy(broken, "shared", init_dir, tmp_path / "b", TrainConfig(loss=LossConfig(kind="ppo"), **FAST))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_policy_rows_epochs_too_long_rows_kl_and_files(tok, model, init_dir, tmp_path):
    rows = rows_for(tok, model, 6, seed=8, policy_id="solver") + rows_for(tok, model, 3, seed=9, policy_id="verifier", agent_id="verifier")
    rows[0]["completion_ids"] = list(range(20, 120))
    rows[0]["completion_logprobs"] = [-5.0] * 100
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok)
    path = tmp_path / "view.parquet"
    import pyarrow.parquet as pq

    pq.write_table(view, path)
    cfg = TrainConfig(report_to="none", temperature=T, minibatch_size=2, micro_batch_size=2, epochs=2, max_length=64, loss=LossConfig(kind="ppo", beta=0.05))
    result = train_from_files(path, "solver", init_dir, tmp_path / "solver", cfg)
    assert result.diagnostics.overall.mean_kl > 0  # the policy moved away from the reference
    assert result.n_rows == 5 and result.n_dropped_too_long == 1
    assert result.min_row_visits == result.max_row_visits == 2  # every row, once per epoch
    assert result.steps == 6  # ceil(5 / 2) per epoch
    assert set(result.diagnostics.by_agent) == {"solver"}
    solver_rows = view.filter(pa.compute.equal(view.column("policy_id"), "solver")).slice(1)
    assert result.data_hash == view_hash(solver_rows)

    empty = train_policy(view, "nobody", init_dir, tmp_path / "nobody", cfg)
    assert empty.steps == 0 and empty.n_rows == 0
    same = AutoModelForCausalLM.from_pretrained(tmp_path / "nobody", dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(params(model).values(), params(same).values()))


def test_lora_checkpoints_are_adapters_that_rounds_continue(tok, model, init_dir, tmp_path):
    """--lora: a checkpoint is the adapter alone (no copy of the base), naming its base folder;
    the next round trains the same adapter on the same base; loading a LoRA checkpoint gives the
    base with the adapter merged, which differs from the base."""
    from pipeline.models import adapter_base, load_model

    view, _ = build_training_view(advantages_table(rows_for(tok, model, 8, seed=10)), {"iid": IID()}, tok)
    cfg = TrainConfig(loss=LossConfig(kind="ppo"), **{**FAST, "lr": 5e-2}, lora=LoraSettings(r=4, alpha=8))
    train_policy(view, "shared", init_dir, tmp_path / "r0", cfg)
    r0 = tmp_path / "r0"
    assert (r0 / "adapter_config.json").is_file() and not list(r0.glob("model*.safetensors"))
    assert adapter_base(r0) == init_dir.resolve()
    assert (r0 / "tokenizer_config.json").is_file()  # engines render prompts from the checkpoint's tokenizer
    merged = load_model(r0)
    before, after = params(model), params(merged)
    assert set(before) == set(after)
    assert any(not torch.equal(before[k], after[k]) for k in before)

    train_policy(view, "shared", r0, tmp_path / "r1", cfg)  # round 1 continues round 0's adapter
    r1 = tmp_path / "r1"
    assert adapter_base(r1) == init_dir.resolve()  # the same base, not round 0's folder
    again = params(load_model(r1))
    assert any(not torch.equal(after[k], again[k]) for k in after)


def test_a_carried_optimizer_continues_as_one_run_and_a_fresh_one_does_not(tok, model, init_dir, tmp_path):
    """`optimizer_state="carry"`: two rounds of one step each on the same rows give the weights of
    one run of two steps (Adam's moments and step count go on: the second step is not a first
    step again); "fresh" gives other weights. Each minibatch is all the rows, so the two paths see
    the same rows in every step."""
    view, _ = build_training_view(advantages_table(rows_for(tok, model, 8, seed=11)), {"iid": IID()}, tok)
    cfg = TrainConfig(loss=LossConfig(kind="ppo"), **{**FAST, "lr": 1e-2, "minibatch_size": 8, "micro_batch_size": 8})
    carry = replace(cfg, optimizer_state="carry")
    train_policy(view, "shared", init_dir, tmp_path / "once", replace(carry, epochs=2))
    for mode, c in (("carry", carry), ("fresh", cfg)):
        train_policy(view, "shared", init_dir, tmp_path / f"{mode}0", c)
        train_policy(view, "shared", tmp_path / f"{mode}0", tmp_path / f"{mode}1", c)
    assert (tmp_path / "carry0" / OPTIMIZER_STATE).is_file() and not (tmp_path / "fresh0" / OPTIMIZER_STATE).exists()
    state = torch.load(tmp_path / "carry1" / OPTIMIZER_STATE, weights_only=True)
    assert {int(v["step"]) for v in state["state"].values()} == {2}
    once, carried, fresh = (params(AutoModelForCausalLM.from_pretrained(tmp_path / d)) for d in ("once", "carry1", "fresh1"))
    start = params(model)
    moved = max((once[k] - start[k]).abs().max().item() for k in once)
    assert moved > 1e-3
    assert max((once[k] - carried[k]).abs().max().item() for k in once) < 1e-3 * moved
    assert max((once[k] - fresh[k]).abs().max().item() for k in once) > 0.05 * moved

    # the next round's learning rate is its own, not the carried scheduler's
    train_policy(view, "shared", tmp_path / "carry0", tmp_path / "still", replace(carry, lr=1e-12))
    r0, still = (params(AutoModelForCausalLM.from_pretrained(tmp_path / d)) for d in ("carry0", "still"))
    assert max((r0[k] - still[k]).abs().max().item() for k in r0) < 1e-6 * moved

    # a policy without rows passes its parent's state on
    train_policy(view, "nobody", tmp_path / "carry1", tmp_path / "empty", carry)
    assert (tmp_path / "empty" / OPTIMIZER_STATE).read_bytes() == (tmp_path / "carry1" / OPTIMIZER_STATE).read_bytes()


def test_a_carried_optimizer_state_that_does_not_fit_is_a_named_error(tok, model, init_dir, tmp_path):
    view, _ = build_training_view(advantages_table(rows_for(tok, model, 8, seed=12)), {"iid": IID()}, tok)
    cfg = TrainConfig(loss=LossConfig(kind="ppo"), **FAST, lora=LoraSettings(r=4, alpha=8), optimizer_state="carry")
    train_policy(view, "shared", init_dir, tmp_path / "r4", cfg)
    state = tmp_path / "r4" / OPTIMIZER_STATE
    assert state.is_file()
    # all weights trained from the adapter's checkpoint: other parameters than the adapter's
    with pytest.raises(ConfigError, match=r"r4/optimizer.pt: the optimizer state does not fit this model's trainable parameters"):
        train_policy(view, "shared", tmp_path / "r4", tmp_path / "full", replace(cfg, lora=None))
    assert not (tmp_path / "full").exists()  # nothing half-written
    # as many tensors of other shapes: a rank-8 adapter given the rank-4 adapter's state
    train_policy(view, "shared", init_dir, tmp_path / "r8", replace(cfg, lora=LoraSettings(r=8, alpha=16)))
    (tmp_path / "r8" / OPTIMIZER_STATE).write_bytes(state.read_bytes())
    with pytest.raises(ConfigError, match=r"r8/optimizer.pt: .*a moment of shape \(4, \d+\) for a parameter of shape \(8, \d+\)"):
        train_policy(view, "shared", tmp_path / "r8", tmp_path / "r8b", cfg)
    state.write_bytes(b"not a torch file")
    with pytest.raises(DataError, match=r"r4/optimizer.pt: not a readable optimizer state"):
        train_policy(view, "shared", tmp_path / "r4", tmp_path / "again", cfg)
    assert not (tmp_path / "again").exists()
    with pytest.raises(ConfigError, match=r"optimizer_state must be one of \['fresh', 'carry'\]"):
        replace(cfg, optimizer_state="keep")


def test_lora_checkpoint_with_a_missing_base_is_a_clear_error(init_dir, tmp_path):
    import json

    from pipeline.errors import ConfigError
    from pipeline.models import load_model

    bad = tmp_path / "adapter"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone"), "r": 4}))
    with pytest.raises(ConfigError, match="base model folder .*gone"):
        load_model(bad)


def test_lora_on_a_model_without_the_target_modules_is_a_clear_error(model):
    from pipeline.errors import ConfigError
    from pipeline.learn.trainer import add_lora

    with pytest.raises(ConfigError, match="none is a module of this model"):
        add_lora(model, LoraSettings(r=4, target_modules=("c_attn",)))


def test_trl_grpo_loss_equals_loss_py_on_a_fixed_batch(tok, init_dir, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    ours = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32).eval()
    theirs = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=2,
        num_generations=2,
        report_to="none",
        use_cpu=True,
        bf16=False,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        temperature=T,
        importance_sampling_level="token",
    )
    trl_trainer = GRPOTrainer(
        model=theirs,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
        processing_class=tok,
    )
    trl_trainer.model.eval()
    rng = random.Random(11)
    rows = [
        dict(
            step_id=f"s{i}",
            train_prompt_ids=[3] + [rng.randint(10, 200) for _ in range(rng.randint(2, 7))] + [5, 4],
            completion_ids=[rng.randint(10, 200) for _ in range(c)],
            sampling_logprobs=[rng.uniform(-6.5, -4.5) for _ in range(c)],
            advantage=rng.uniform(-1.5, 1.5),
            sample_weight=w,
            reward=1.0,
            strategy="iid",
            agent_id="solver",
        )
        for i, (c, w) in enumerate([(3, 1.0), (5, 2.0), (1, 0.5), (4, 1.5)])
    ]
    batch = collate(rows, tok.pad_token_id)
    trl_inputs = {
        "prompt_ids": batch["prompt_ids"],
        "prompt_mask": batch["prompt_mask"],
        "completion_ids": batch["completion_ids"],
        "completion_mask": batch["completion_mask"].long(),
        # TRL has no sample weights: fold them into its advantages
        "advantages": batch["advantages"] * batch["sample_weight"],
        "old_per_token_logps": batch["sampling_logprobs"],
    }
    for trl_type, aggregation in (("grpo", "seq-mean-token-mean"), ("bnpo", "token-mean")):
        trl_trainer.loss_type = trl_type
        trl_trainer.model.zero_grad()
        theirs_loss = trl_trainer._compute_loss(trl_trainer.model, trl_inputs)
        theirs_loss.backward()
        ours.zero_grad()
        ours_loss = batch_loss(ours, batch, LossConfig(kind="ppo", aggregation=aggregation, ratio=RatioConfig(mode="none")), T).loss
        ours_loss.backward()
        assert ours_loss.item() == pytest.approx(theirs_loss.item(), abs=1e-6), trl_type
        g_theirs = torch.cat([p.grad.flatten() for p in trl_trainer.model.parameters()])
        g_ours = torch.cat([p.grad.flatten() for p in ours.parameters()])
        assert torch.allclose(g_ours, g_theirs, atol=1e-6), trl_type


def test_shared_or_separate_policies_and_tensorboard_logs(tok, model, init_dir, tmp_path):
    rows = rows_for(tok, model, 4, seed=12, policy_id="solver") + rows_for(tok, model, 2, seed=13, policy_id="verifier", agent_id="verifier")
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok)
    cfg = TrainConfig(loss=LossConfig(kind="ppo"), **{**FAST, "report_to": "tensorboard"})
    results = {pid: train_policy(view, pid, init_dir, tmp_path / "round0" / pid, cfg) for pid in ("solver", "verifier")}
    assert {k: r.n_rows for k, r in results.items()} == {"solver": 4, "verifier": 2}
    assert set(results["verifier"].diagnostics.by_agent) == {"verifier"}
    for pid in ("solver", "verifier"):
        assert read_checkpoint_meta(tmp_path / "round0" / pid).policy_id == pid
        assert list((tmp_path / "round0" / pid / "logs").rglob("events.out.tfevents*"))


def test_a_minibatch_is_one_token_mean_whatever_its_micro_batches(tok, model, init_dir, tmp_path):
    """Rows of different lengths: the loss and gradient of a minibatch of 8 are the same with
    micro-batches of 8, 4 or 2 (a mean of micro-batch means would weigh short rows more)."""
    rows = rows_for(tok, model, 8, seed=21)
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok)
    assert len({len(r["completion_ids"]) for r in rows}) > 1
    data = to_dataset(view).to_list()
    cfg = LossConfig(kind="ppo", ratio=RatioConfig(mode="none"))

    def grads(micro: int):
        m = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
        batches = [collate(data[i : i + micro], tok.pad_token_id) for i in range(0, 8, micro)]
        total = minibatch_count(batches, cfg)
        loss = sum(batch_loss(m, b, cfg, T, denominator=total).loss for b in batches)
        loss.backward()
        return loss.item(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}

    whole_loss, whole = grads(8)
    for micro in (4, 2):
        loss, g = grads(micro)
        assert loss == pytest.approx(whole_loss, rel=1e-5)
        for k in whole:
            assert torch.allclose(whole[k], g[k], atol=1e-7, rtol=1e-4), (micro, k)
    # through the Trainer: the reported loss of the one step is the same whole-minibatch mean
    losses = {}
    for micro in (8, 2):
        res = train_policy(view, "shared", init_dir, tmp_path / f"m{micro}", TrainConfig(**{**FAST, "micro_batch_size": micro, "loss": cfg}))
        losses[micro] = res.mean_loss
    assert losses[2] == pytest.approx(losses[8], rel=1e-5) and losses[8] == pytest.approx(whole_loss, rel=1e-5)


def test_first_step_diagnostics_see_the_ratios_before_any_update(tok, model, init_dir, tmp_path):
    """Two steps over rows sampled by the model itself: at the first step every log ratio is 0
    (sampling and training agree); over the run the policy has moved."""
    view, _ = build_training_view(advantages_table(rows_for(tok, model, 16, seed=22)), {"iid": IID()}, tok)
    res = train_policy(view, "shared", init_dir, tmp_path / "ckpt", TrainConfig(loss=LossConfig(kind="ppo"), **{**FAST, "lr": 5e-2}))
    assert res.steps == 2
    first = res.first_step_diagnostics
    assert first.overall.n_rows == 8 and abs(first.overall.mean_log_ratio) < 1e-5
    assert first.by_agent_strategy["solver/iid"].n_rows == 8
    assert res.diagnostics.overall.n_rows == 16 and abs(res.diagnostics.overall.mean_log_ratio) > 1e-4


def test_proximal_anchor_clips_against_the_policy_before_the_update(tok, model, init_dir, tmp_path):
    """Off-policy rows (q is e^0.5 times p_old on every token, negative advantages): against q
    the first step already clips every token (ratio 0.61 < 0.8); against p_old (the policy at the
    start of the update, on the training context) nothing is clipped at step one, and the rows
    still get a gradient, scaled by the off-policy weight p_old/q."""
    rows = rows_for(tok, model, 8, seed=23)
    for r in rows:
        r["completion_logprobs"] = [x + 0.5 for x in r["completion_logprobs"]]
        r["advantage"] = -1.0
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok)
    none = RatioConfig(mode="none")
    sampling = train_policy(view, "shared", init_dir, tmp_path / "q", TrainConfig(**FAST, loss=LossConfig(kind="ppo", ratio=none)))
    proximal = train_policy(view, "shared", init_dir, tmp_path / "old", TrainConfig(**FAST, loss=LossConfig(kind="ppo", anchor="proximal", ratio=none)))
    first_q, first_old = sampling.first_step_diagnostics.overall, proximal.first_step_diagnostics.overall
    assert first_q.n_clipped_tokens == first_q.n_tokens > 0
    assert first_old.n_clipped_tokens == 0
    assert first_old.mean_log_ratio == pytest.approx(-0.5, abs=1e-4)  # diagnostics still report p_theta vs q
    before = params(model)
    moved = params(AutoModelForCausalLM.from_pretrained(tmp_path / "old", dtype=torch.float32))
    assert any(not torch.equal(before[k], moved[k]) for k in before)
    assert read_checkpoint_meta(tmp_path / "old").config["loss"]["anchor"] == "proximal"


# ---------------------------------------------------------------------------------------------
# the pieces of a run


class RandomLogits(torch.nn.Module):
    """A stand-in causal LM whose logits over the whole (B, L) input are fixed random values."""

    def __init__(self, batch: int, length: int, vocab: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.nn.Parameter(torch.randn(batch, length, vocab, generator=g) * 4.0)

    def forward(self, input_ids, attention_mask, position_ids, logits_to_keep, use_cache):
        assert input_ids.shape == self.logits.shape[:2]
        return SimpleNamespace(logits=self.logits[:, -logits_to_keep:, :])


def test_completion_logps_equal_log_softmax_and_gather_at_the_temperature():
    """TRL's selective_log_softmax in completion_logps gives the plain log_softmax(logits / T) +
    gather at every completion token, the same gradients, and 0 on padding."""
    rng = random.Random(31)
    rows = [
        dict(
            step_id=f"s{i}", train_prompt_ids=[rng.randint(1, 999) for _ in range(p)], completion_ids=[rng.randint(1, 999) for _ in range(c)],
            sampling_logprobs=[-1.0] * c, advantage=1.0, sample_weight=1.0, reward=1.0, strategy="iid", agent_id="solver",
        )
        for i, (p, c) in enumerate([(3, 5), (6, 1), (2, 7), (4, 4)])
    ]
    batch = collate(rows, 0)
    b, p_len = batch["prompt_ids"].shape
    c_len = batch["completion_ids"].size(1)
    for temperature in (0.7, 1.0, 1.3):
        lm = RandomLogits(b, p_len + c_len, 1000)
        ours = completion_logps(lm, batch, temperature)
        (ours * torch.arange(1.0, c_len + 1)).sum().backward()
        g_ours, lm.logits.grad = lm.logits.grad.clone(), None
        shifted = lm.logits[:, -(c_len + 1) : -1, :] / temperature
        plain = torch.log_softmax(shifted, dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1) * batch["completion_mask"]
        (plain * torch.arange(1.0, c_len + 1)).sum().backward()
        # float32: 1e-6 plus one part in a million (the rounding step of a logprob near -16 is 2e-6)
        assert torch.allclose(ours, plain, atol=1e-6, rtol=1e-6), temperature
        assert torch.allclose(g_ours, lm.logits.grad, atol=1e-6, rtol=1e-5), temperature  # float32 rounding of gradients up to ~10
        assert (ours[batch["completion_mask"] == 0] == 0).all()


def test_chunked_vocabulary_projection_gives_the_same_logprobs_and_gradients(init_dir):
    """Above the logits budget the completion positions are projected a few rows at a time under
    activation checkpointing: the same logprobs and parameter gradients as one projection."""
    model = AutoModelForCausalLM.from_pretrained(init_dir)
    rng = random.Random(5)
    rows = [
        dict(
            step_id=f"s{i}", train_prompt_ids=[rng.randint(3, 200) for _ in range(p)], completion_ids=[rng.randint(3, 200) for _ in range(c)],
            sampling_logprobs=[-1.0] * c, advantage=1.0, sample_weight=1.0, reward=1.0, strategy="iid", agent_id="solver",
        )
        for i, (p, c) in enumerate([(5, 4), (9, 2), (3, 6), (7, 5), (4, 1)])
    ]
    batch = collate(rows, 0)
    c_len = batch["completion_ids"].size(1)
    vocab = model.config.vocab_size
    results = []
    for budget in (None, 2 * c_len * vocab):  # one projection; two rows per chunk (3 chunks)
        model.zero_grad()
        logp = completion_logps(model, batch, T, budget)
        (logp * torch.arange(1.0, c_len + 1)).sum().backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain, g_plain), (chunked, g_chunked) = results
    assert torch.allclose(plain, chunked, atol=1e-6, rtol=1e-6)
    for name in g_plain:
        assert torch.allclose(g_plain[name], g_chunked[name], atol=1e-6, rtol=1e-5), name
    with torch.no_grad():
        assert torch.allclose(completion_logps(model, batch, T, 1), plain, atol=1e-6, rtol=1e-6)  # one row per chunk, no grad
    with pytest.raises(ConfigError, match="logits_chunk_mb"):
        TrainConfig(logits_chunk_mb=-1)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_shared_prompt_prefix_computed_once_gives_the_same_logprobs_and_gradients(init_dir, checkpointing, lora, chunked):
    """Rows whose prompts begin with the same tokens (a task's system prompt and worked examples):
    with `share_prefix` the prefix runs once and the rows run on top of its keys and values, under
    gradient checkpointing or not, LoRA or all weights, one vocabulary projection or chunks; the
    logprobs and every trainable weight's gradient equal the full rows'."""
    from pipeline.learn.trainer import add_lora, shared_prefix_length

    model = AutoModelForCausalLM.from_pretrained(init_dir)
    if lora:
        model = add_lora(model, LoraSettings(r=4, alpha=8))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    rng = random.Random(11)
    prefix = [rng.randint(3, 200) for _ in range(12)]
    rows = [
        dict(
            step_id=f"s{i}", train_prompt_ids=prefix + [rng.randint(3, 200) for _ in range(p)], completion_ids=[rng.randint(3, 200) for _ in range(c)],
            sampling_logprobs=[-1.0] * c, advantage=1.0, sample_weight=1.0, reward=1.0, strategy="iid", agent_id="solver",
        )
        for i, (p, c) in enumerate([(5, 4), (9, 2), (1, 6), (7, 5)])
    ]
    batch = collate(rows, 0)
    assert shared_prefix_length(batch) == 12  # the shortest prompt (13 tokens) keeps its last token
    from pipeline.learn.trainer.forward import model_inputs

    assert "past_key_values" in model_inputs(model, batch, 8)[0]  # the prefix is shared, not run per row
    assert "past_key_values" not in model_inputs(model, batch, 0)[0]
    c_len = batch["completion_ids"].size(1)
    budget = 2 * c_len * model.config.vocab_size if chunked else None
    results = []
    for share in (0, 8):
        model.zero_grad()
        logp = completion_logps(model, batch, T, budget, share_prefix=share)
        (logp * torch.arange(1.0, c_len + 1)).sum().backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    (full, g_full), (shared, g_shared) = results
    assert torch.allclose(full, shared, atol=1e-5, rtol=1e-5)
    assert (shared[batch["completion_mask"] == 0] == 0).all()
    for name in g_full:
        assert torch.allclose(g_full[name], g_shared[name], atol=1e-5, rtol=1e-4), name
    # the flags the shared pass sets on the layers are gone again
    layers = [m for m in model.modules() if hasattr(m, "_can_checkpoint_with_cache")]
    assert layers and all("_can_checkpoint_with_cache" not in vars(m) for m in layers)
    assert all(m.gradient_checkpointing == checkpointing for m in layers)
    with torch.no_grad():
        assert torch.allclose(completion_logps(model, batch, T, budget, share_prefix=8), full, atol=1e-5, rtol=1e-5)
        # below the threshold, or when a row does not begin with the prefix, the rows run whole
        assert torch.allclose(completion_logps(model, batch, T, budget, share_prefix=13), full, atol=1e-6, rtol=1e-6)
    rows[1]["train_prompt_ids"] = [7] + rows[1]["train_prompt_ids"][1:]
    assert shared_prefix_length(collate(rows, 0)) == 0


def test_a_prefix_all_rows_share_counts_once_in_the_micro_batch_budget():
    """The micro-batch budgets count a prompt prefix common to every row once (it runs once per
    micro-batch); below `share_prefix` tokens, or with sharing off, every row counts whole."""
    from pipeline.learn import trainer as tr

    prefix = list(range(100, 180))  # 80 tokens every prompt begins with
    table = pa.table({
        "train_prompt_ids": [prefix + [n] * n for n in (10, 20, 5, 15)],
        "completion_ids": [[6] * 10] * 4,
    })
    assert tr.common_prompt_prefix(table) == 80
    assert tr.common_prompt_prefix(table.slice(0, 1)) == 0
    longest = 80 + 20 + 10
    model = torch.nn.Linear(1, 1)  # no config: only the token budget applies
    cfg = TrainConfig(**{**FAST, "minibatch_size": 4, "micro_batch_size": 4}, micro_batch_tokens=2 * longest, activation_mb=0)
    assert tr.sized_for(replace(cfg, share_prefix=0), table, model).micro_batch_size == 2  # 2 whole rows
    # 220 tokens: the prefix once (80) + 4 rows of their own 30 tokens (120)
    assert tr.sized_for(cfg, table, model).micro_batch_size == 4
    assert tr.sized_for(replace(cfg, share_prefix=81), table, model).micro_batch_size == 2
    with pytest.raises(ConfigError, match="share_prefix"):
        TrainConfig(share_prefix=-1)


def test_rows_that_begin_alike_are_sorted_side_by_side():
    """Under `share_prefix` the rows of a minibatch whose prompts begin with the same tokens are
    put side by side (the largest group first), still trainable rows first and longest first
    within a group, so a micro-batch holds rows that share their prefix."""
    from pipeline.learn.trainer import MinibatchSortedSampler, prefix_groups, row_sort_keys

    solver, verifier = list(range(100, 140)), list(range(100, 110)) + list(range(300, 330))  # alike for 10 tokens only
    prompts = [solver + [1] * 3, verifier + [2] * 9, solver + [3] * 7, verifier + [4], solver + [5] * 5, [9] * 5]
    table = pa.table({"train_prompt_ids": prompts, "completion_ids": [[6] * 4] * 6})
    groups = prefix_groups(table, 32)
    assert groups == [0, 1, 0, 1, 0, 2]  # the Solver's three rows, the Verifier's two, a short prompt
    assert prefix_groups(table, 8) == [0] * 5 + [1]  # all five begin with the same 8 tokens
    lengths = [(len(p), 4) for p in prompts]
    order = list(MinibatchSortedSampler(range(6), row_sort_keys(lengths, None, groups), 6))
    assert order == [2, 4, 0, 1, 3, 5]
    # trainable rows still come first, whatever their group
    order = list(MinibatchSortedSampler(range(6), row_sort_keys(lengths, [True, True, False, True, True, True], groups), 6))
    assert order == [4, 0, 1, 3, 5, 2]


def _view_rows(tok, spec, **overrides) -> pa.Table:
    """A training view of rows (step_id, policy_id, completion length) sampled at T."""
    msgs = [{"role": "user", "content": "1+2="}]
    prompt = encode_prompt(tok, msgs)
    rows = [
        advantage_row(
            sid, policy_id=pid, agent_id=pid, sampling_messages=msgs, prompt_ids=prompt, completion_ids=[6] * n,
            completion_logprobs=[-1.0] * n, temperature=T, **overrides.get(sid, {}),
        )
        for sid, pid, n in spec
    ]
    return build_training_view(advantages_table(rows), {"iid": IID()}, tok)[0]


def test_select_policy_rows_keeps_the_policys_rows_that_fit_and_checks_them(tok):
    view = _view_rows(tok, [("a", "solver", 2), ("b", "solver", 30), ("c", "verifier", 2), ("d", "solver", 3)])
    prompt_len = len(view.column("train_prompt_ids")[0].as_py())
    sel = select_policy_rows(view, "solver", max_length=prompt_len + 3, temperature=T)
    assert isinstance(sel, PolicyRows)
    assert sorted(sel.table.column("step_id").to_pylist()) == ["a", "d"]
    assert set(sel.table.column("policy_id").to_pylist()) == {"solver"}
    assert sel.n_dropped_too_long == 1 and sel.round == 0 and sel.data_hash == view_hash(sel.table)
    assert select_policy_rows(view, "solver", max_length=prompt_len + 30, temperature=T).n_dropped_too_long == 0
    assert select_policy_rows(view, "solver", max_length=prompt_len + 3, temperature=T, round_=4).round == 4
    nobody = select_policy_rows(view, "nobody", max_length=prompt_len + 3, temperature=T)
    assert nobody.table.num_rows == 0 and nobody.round is None
    with pytest.raises(ConfigError, match="temperature"):
        select_policy_rows(view, "solver", max_length=prompt_len + 3, temperature=1.0)
    two_rounds = _view_rows(tok, [("a", "solver", 2), ("b", "solver", 2)], b={"round": 1})
    with pytest.raises(DataError, match="several rounds"):
        select_policy_rows(two_rounds, "solver", max_length=prompt_len + 3, temperature=T)
    assert select_policy_rows(two_rounds, "solver", max_length=prompt_len + 3, temperature=T, round_=1).round == 1


def test_max_train_length_prefers_the_config_then_the_model():
    assert max_train_length(TrainConfig(max_length=64), SimpleNamespace(max_position_embeddings=512)) == 64
    assert max_train_length(TrainConfig(), SimpleNamespace(max_position_embeddings=512)) == 512
    assert max_train_length(TrainConfig(), SimpleNamespace()) == 1 << 30


def test_training_arguments_carry_the_train_config(tmp_path):
    cfg = TrainConfig(loss=LossConfig(kind="ppo"), report_to="none", lr=3e-4, epochs=3, minibatch_size=8, micro_batch_size=2, seed=7, weight_decay=0.1,
                      max_grad_norm=0.5, lr_scheduler="cosine", warmup_steps=2, logging_steps=5)
    args = training_arguments(cfg, tmp_path / "logs", use_cuda=False)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.num_train_epochs) == (2, 4, 3)
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm, args.warmup_steps, args.logging_steps) == (3e-4, 0.1, 0.5, 2, 5)
    assert str(args.lr_scheduler_type.value) == "cosine" and args.seed == args.data_seed == 7
    assert args.use_cpu and not args.bf16 and args.report_to == [] and args.output_dir == str(tmp_path / "logs")
    assert str(args.save_strategy.value) == "no" and not args.remove_unused_columns and args.disable_tqdm


def test_throughput_visits_metrics_and_result_of_a_run(tmp_path):
    assert throughput(300, 1.5) == 200.0 and throughput(300, 0.0) == 0.0
    assert visit_range(["a", "b", "c"], {"a": 2, "b": 2, "c": 1}) == (1, 2)
    assert visit_range(["a", "z"], {"a": 2}) == (0, 2)  # a row never trained on counts 0
    assert visit_range([], {}) == (0, 0)

    rows = PolicyRows(table=pa.table({"step_id": ["a", "b"]}), n_dropped_too_long=3, round=2, data_hash="h")
    run = TrainerRun(model=None, steps=4, seconds=2.0, mean_loss=0.25, completion_tokens=100, tokens_per_second=throughput(100, 2.0), rows_seen={"a": 2, "b": 2})
    metrics = checkpoint_metrics(run, rows.n_dropped_too_long)
    assert {k: metrics[k] for k in ("mean_loss", "steps", "train_seconds", "completion_tokens", "tokens_per_second", "n_dropped_too_long")} == {
        "mean_loss": 0.25, "steps": 4.0, "train_seconds": 2.0, "completion_tokens": 100.0, "tokens_per_second": 50.0, "n_dropped_too_long": 3.0,
    }
    result = train_result("solver", tmp_path / "init", tmp_path / "out", rows, run, visit_range(["a", "b"], run.rows_seen))
    assert (result.tokens_per_second, result.train_seconds, result.n_rows, result.round, result.data_hash) == (50.0, 2.0, 2, 2, "h")
    assert (result.min_row_visits, result.max_row_visits, result.n_dropped_too_long, result.steps) == (2, 2, 3, 4)
    meta = checkpoint_meta("solver", tmp_path / "init", rows, TrainConfig(), metrics)
    assert (meta.round, meta.n_rows, meta.parent, meta.data_hash) == (2, 2, str(tmp_path / "init"), "h")
    assert meta.config["loss"]["ratio"]["mode"] == "mask" and meta.config["lora"] is None

    empty = TrainerRun(model=None)  # a policy without rows
    assert math.isnan(empty.mean_loss) and empty.tokens_per_second == 0.0 and checkpoint_metrics(empty, 0)["steps"] == 0.0


@dataclass(frozen=True)
class _Inner:
    path: Path
    values: tuple = (1.0, math.nan)


@dataclass(frozen=True)
class _Outer:
    inner: _Inner
    table: dict = field(default_factory=lambda: {1: math.inf, "x": [-math.inf, 2]})


def test_jsonable_gives_strict_json_values(tmp_path):
    out = jsonable(_Outer(_Inner(tmp_path / "a")))
    assert out == {"inner": {"path": str(tmp_path / "a"), "values": [1.0, None]}, "table": {"1": None, "x": [None, 2]}}
    json.dumps(out, allow_nan=False)
    assert jsonable(_Outer) is _Outer  # a class is not an instance


def test_a_view_with_corrupt_data_pages_is_a_named_data_error(tmp_path, init_dir):
    """An intact footer over corrupt pages passes a footer check; reading the rows names the file."""
    import pyarrow.parquet as pq

    path = tmp_path / "view.parquet"
    pq.write_table(pa.table({"policy_id": ["shared"] * 200, "x": list(range(200))}), path)
    data = bytearray(path.read_bytes())
    data[8:60] = b"\xab" * 52  # the first page header and data, after the "PAR1" magic
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"--view .*view\.parquet: not a readable Parquet file"):
        train_from_files(path, "shared", init_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_micro_batches_follow_the_token_budget_and_checkpointing_is_automatic(tok, model, init_dir, tmp_path):
    """`micro_batch_tokens` shrinks the micro-batch to the largest divisor of the minibatch whose
    rows x longest row fit; the optimizer step is unchanged; auto checkpointing is off for a tiny
    model and on above the parameter threshold; the checkpoint records what was used."""
    from pipeline.learn import trainer as tr

    view, _ = build_training_view(advantages_table(rows_for(tok, model, 8, seed=3)), {"iid": IID()}, tok)
    table = tr.select_policy_rows(view, "shared", max_length=10_000, temperature=T).table
    longest = max(len(p) + len(c) for p, c in zip(table.column("train_prompt_ids").to_pylist(), table.column("completion_ids").to_pylist()))
    cfg = TrainConfig(loss=LossConfig(kind="ppo"), **{**FAST, "minibatch_size": 12, "micro_batch_size": 12}, micro_batch_tokens=5 * longest, gradient_checkpointing=None)
    sized = tr.sized_for(cfg, table, model)
    assert sized.micro_batch_size == 4  # divisors of 12 that fit 5 rows: 1, 2, 3, 4
    assert sized.minibatch_size == 12 and sized.gradient_checkpointing is False
    assert tr.sized_for(replace(cfg, micro_batch_tokens=1), table, model).micro_batch_size == 1
    assert tr.sized_for(replace(cfg, micro_batch_tokens=None), table, model).micro_batch_size == 12
    big = replace(cfg, micro_batch_tokens=None)
    from pipeline.learn.trainer import memory

    tr_threshold = memory.CHECKPOINTING_PARAMETERS
    try:
        memory.CHECKPOINTING_PARAMETERS = 10  # the tiny model counts as large
        assert tr.sized_for(big, table, model).gradient_checkpointing is True
    finally:
        memory.CHECKPOINTING_PARAMETERS = tr_threshold

    # the activation budget: the tiny model's rows never reach the default; a model with the
    # width and depth of SmolLM2-135M (576 x 30: 276 KB a token) gets the micro-batch that fits
    assert tr.activation_bytes_per_token(model) * longest * 12 < TrainConfig().activation_mb * 2**20
    assert tr.sized_for(big, table, model).micro_batch_size == 12
    import types

    wide = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=576, num_hidden_layers=30), parameters=model.parameters)
    assert tr.activation_bytes_per_token(wide) == 576 * 30 * 16
    budget = 3.5 * longest * 576 * 30 * 16 / 2**20  # room for 3.5 rows: 3 fit, a divisor of 12
    assert tr.sized_for(replace(big, activation_mb=budget), table, wide).micro_batch_size == 3
    assert tr.sized_for(replace(big, activation_mb=0), table, wide).micro_batch_size == 12
    with pytest.raises(ConfigError, match="activation_mb"):
        TrainConfig(activation_mb=-1)

    result = train_policy(view, "shared", init_dir, tmp_path / "ckpt", replace(cfg, minibatch_size=8, micro_batch_size=8, micro_batch_tokens=2 * longest))
    meta = tr.read_checkpoint_meta(result.checkpoint)
    assert meta.config["micro_batch_size"] == 2 and result.steps == 1  # 8 rows: one optimizer step of four micro-batches


def test_select_rows_batches_the_rows_as_collate_does(tok, model):
    from pipeline.learn.trainer import select_rows

    data = to_dataset(build_training_view(advantages_table(rows_for(tok, model, 6, seed=31)), {"iid": IID()}, tok)[0]).to_list()
    data = [{**r, "old_logprobs": [x - 0.1 for x in r["sampling_logprobs"]]} for r in data]
    whole = collate(data, tok.pad_token_id)
    for index in ([0], [1, 4], [5, 2, 3]):
        got, want = select_rows(whole, index), collate([data[i] for i in index], tok.pad_token_id)
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert (torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v), (index, k)


class _Grads(TrainerCallback):
    """The gradients of every optimizer step, as the optimizer sees them."""

    def __init__(self):
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize(
    "loss, zero",
    [
        (LossConfig(kind="ppo", ratio=RatioConfig(mode="none")), "advantage"),  # A = 0
        (LossConfig(kind="exit"), "weight"),  # w = 0 (the plan's feedback first attempt)
        (LossConfig(kind="ppo", negative_weight=0.0), "negative"),  # the ppo preset: negative rows at weight 0
        (LossConfig(kind="rs"), "reward"),  # below the threshold
    ],
)
def test_rows_whose_loss_is_zero_are_skipped_with_the_same_update(tok, model, init_dir, tmp_path, monkeypatch, loss, zero):
    """Rows whose loss is exactly 0 are left out of the forward pass; the minibatch's denominator
    still counts them, so each step's gradients (and the reported loss) are those of the run
    that forwards them; the skipped rows are counted, micro-batches of zero rows included (those
    run no forward pass at all)."""
    from pipeline.learn import trainer as tr
    from pipeline.learn.trainer import trainable_rows

    rows = rows_for(tok, model, 12, seed=32)
    for i, r in enumerate(rows):
        r["advantage"] = abs(r["advantage"]) * (1 if i % 3 else -1)
        r["reward"] = 1.0
    zero_rows = [0, 3, 4, 5, 7, 9] if zero != "negative" else [i for i, r in enumerate(rows) if r["advantage"] < 0]
    for i in zero_rows:
        if zero == "advantage":
            rows[i]["advantage"] = 0.0
        elif zero == "reward":
            rows[i]["reward"] = 0.0
    from pipeline.config import ViewConfig

    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok, ViewConfig(drop_zero_advantage=False))
    if zero == "weight":  # the view drops rows of weight 0; the trainer's input may still hold them
        zero_ids = {rows[i]["step_id"] for i in zero_rows}
        col = view.schema.get_field_index("sample_weight")
        weights = [0.0 if sid in zero_ids else w for sid, w in zip(view.column("step_id").to_pylist(), view.column(col).to_pylist())]
        view = view.set_column(col, view.schema.field(col), pa.array(weights, view.schema.field(col).type))
    items = to_dataset(view).to_list()
    assert len(items) == 12
    columns = [[r[k] for r in items] for k in ("advantage", "sample_weight", "reward", "strategy")]
    assert sum(not t for t in trainable_rows(*columns, loss)) == len(zero_rows)
    runs = {}
    skipped_micro_batches = []
    original = tr.run_trainer

    def counting(*args, **kwargs):
        run = original(*args, **kwargs)
        skipped_micro_batches.append(run.micro_batches_skipped)
        return run

    monkeypatch.setattr(tr.train, "run_trainer", counting)  # where `train_policy` finds it
    for skip in (False, True):
        grads = _Grads()
        cfg = TrainConfig(**{**FAST, "minibatch_size": 12, "micro_batch_size": 3, "epochs": 2, "loss": loss}, skip_zero_rows=skip)
        runs[skip] = (train_policy(view, "shared", init_dir, tmp_path / f"skip{skip}", cfg, callbacks=[grads]), grads.steps)
    # the zero rows sorted last fill whole micro-batches, which then run no forward pass at all
    assert skipped_micro_batches[0] == 0 and skipped_micro_batches[1] >= 2
    (plain, plain_grads), (skipped, skipped_grads) = runs[False], runs[True]
    assert plain.rows_skipped == 0 and skipped.rows_skipped == 2 * len(zero_rows)  # two epochs
    assert skipped.steps == plain.steps == 2 and skipped.mean_loss == pytest.approx(plain.mean_loss, rel=1e-5, abs=1e-7)
    assert (skipped.min_row_visits, skipped.max_row_visits) == (2, 2)  # a skipped row was still in its minibatch
    assert skipped.diagnostics.overall.n_rows == 2 * (12 - len(zero_rows)) and plain.diagnostics.overall.n_rows == 24
    for g_plain, g_skip in zip(plain_grads, skipped_grads, strict=True):
        assert g_plain.keys() == g_skip.keys()
        for k in g_plain:
            assert torch.allclose(g_plain[k], g_skip[k], atol=1e-7, rtol=1e-4), k
    if zero == "negative":
        assert any(g.abs().sum() > 0 for g in plain_grads[0].values())
    a = AutoModelForCausalLM.from_pretrained(plain.checkpoint, dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(skipped.checkpoint, dtype=torch.float32).state_dict()
    # the weights after two Adam steps: Adam divides by |g|, so float noise in a near-zero gradient
    # element moves it by ~1e-6, far below one step (lr 5e-4)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_group_shuffle_sampler_keeps_groups_together_and_reshuffles_per_epoch():
    from pipeline.learn.trainer import GroupShuffleSampler

    groups = [g for g in "abcdef" for _ in range(4)][::-1]  # 6 groups of 4, rows in any order
    sampler = GroupShuffleSampler(groups, seed=3)
    orders = [list(sampler) for _ in range(3)]
    for order in orders:
        assert sorted(order) == list(range(24)) and len(sampler) == 24
        runs = [groups[i] for i in order]
        assert all(len(set(runs[k : k + 4])) == 1 for k in range(0, 24, 4))  # each group's rows side by side
    assert len({tuple(o) for o in orders}) == 3  # every epoch another order
    again = GroupShuffleSampler(groups, seed=3)
    again.set_epoch(1)
    assert list(again) == orders[1]  # seeded: epoch 1 of the same seed


def test_grouped_minibatches_train_whole_groups_per_step(tok, model, init_dir, tmp_path, monkeypatch):
    """`group_minibatches`: with groups of 4 rows (4 samples of each of 4 prompts) and minibatches
    of 8, every optimizer step trains two whole groups; without it the steps mix rows of the groups."""
    from pipeline.learn import trainer as tr

    base = rows_for(tok, model, 4, seed=50)
    rows = []
    for g, proto in enumerate(base):  # 4 samples of each prompt, other completions
        for k in range(4):
            completion = [20 + g, 30 + k, 40 + (g * k) % 7, 1]
            rows.append(advantage_row(f"iid-g{g}-s{k}", **{
                **{c: proto[c] for c in ("sampling_messages", "prompt_ids", "temperature")}, "uid": f"p{g}", "sample_idx": k,
                "completion_ids": completion, "completion_logprobs": unpadded_logps(model, proto["prompt_ids"], completion, T),
                "advantage": 1.5 if k == 0 else -0.5, "reward": float(k == 0),
            }))
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok)
    group_of = {r["step_id"]: r["uid"] for r in rows}
    seen: list[list[str]] = []
    original = tr.MaxitTrainer._get_num_items_in_batch

    def record(self, batch_samples, device):
        seen.append([s for b in batch_samples for s in b["step_id"]])
        return original(self, batch_samples, device)

    monkeypatch.setattr(tr.MaxitTrainer, "_get_num_items_in_batch", record)
    mixed = 0
    for grouped in (True, False):
        seen.clear()
        cfg = TrainConfig(loss=LossConfig(kind="ppo"), **{**FAST, "minibatch_size": 8, "micro_batch_size": 4, "epochs": 3}, group_minibatches=grouped)
        train_policy(view, "shared", init_dir, tmp_path / f"g{grouped}", cfg)
        assert len(seen) == 6
        counts = [sorted(Counter(group_of[s] for s in step).values()) for step in seen]
        if grouped:
            assert all(c == [4, 4] for c in counts), counts
            assert len({tuple(sorted(step)) for step in seen}) > 2  # the pairs of groups change between epochs
        else:
            mixed = sum(c != [4, 4] for c in counts)
    assert mixed > 0  # row-shuffled steps split groups (seeded: not by chance here)


def test_minibatches_keep_their_rows_when_sorted_by_length(tok, model, init_dir, tmp_path, monkeypatch):
    """Sorting by length reorders rows inside each minibatch only: every optimizer step trains the
    rows it trains unsorted (two epochs, different shuffles), each micro-batch is longest first,
    and less of the forward passes is padding."""
    from pipeline.learn import trainer as tr

    rows = rows_for(tok, model, 16, seed=33)
    for i, r in enumerate(rows):  # lengths that differ a lot
        r["completion_ids"] = r["completion_ids"] * (1 + i % 4)
        r["completion_logprobs"] = unpadded_logps(model, r["prompt_ids"], r["completion_ids"], T)
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok)
    lengths = {r["step_id"]: len(r["completion_ids"]) for r in rows}
    seen: list[list[list[str]]] = []
    original = tr.MaxitTrainer._get_num_items_in_batch

    def record(self, batch_samples, device):
        seen.append([list(b["step_id"]) for b in batch_samples])
        return original(self, batch_samples, device)

    monkeypatch.setattr(tr.MaxitTrainer, "_get_num_items_in_batch", record)
    results = {}
    steps = {}
    for sort in (False, True):
        seen.clear()
        cfg = TrainConfig(loss=LossConfig(kind="ppo"), **{**FAST, "minibatch_size": 8, "micro_batch_size": 2, "epochs": 2}, sort_by_length=sort, micro_batch_tokens=None)
        results[sort] = train_policy(view, "shared", init_dir, tmp_path / f"sort{sort}", cfg)
        steps[sort] = [list(step) for step in seen]
    assert len(steps[True]) == len(steps[False]) == 4
    for plain, sorted_ in zip(steps[False], steps[True]):
        assert sorted(sum(plain, [])) == sorted(sum(sorted_, []))  # the same rows in the step
        order = [lengths[s] for mb in sorted_ for s in mb]
        assert order == sorted(order, reverse=True)
    assert {tuple(sorted(sum(s, []))) for s in steps[True][:2]} != {tuple(sorted(sum(s, []))) for s in steps[True][2:]}  # epochs reshuffle
    assert results[True].padding_fraction < results[False].padding_fraction
    assert results[True].mean_loss == pytest.approx(results[False].mean_loss, rel=1e-4)


def test_opsplit_sums_a_profile_into_kinds_without_counting_twice():
    """benchmarks/opsplit.py (the --profile of prefix.py and vllm_cpu.py): a matmul, an attention
    call and a cast each land in their kind, and the kinds add up to the operators' self time."""
    import sys

    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from opsplit import TRAIN_KINDS, kind_of, shares_line, split_seconds

    a = torch.randn(64, 64)
    q = torch.randn(1, 2, 8, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a @ a
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        a.to(torch.bfloat16)
        torch.relu(a)
    events = prof.key_averages()
    split = split_seconds(events, TRAIN_KINDS)
    assert set(split) == {"matmul", "attention", "casts", "other"}
    assert split["matmul"] > 0 and split["attention"] > 0 and split["casts"] > 0 and split["other"] > 0
    assert sum(split.values()) == pytest.approx(sum(e.self_cpu_time_total for e in events) / 1e6)
    assert kind_of("aten::_scaled_dot_product_flash_attention_for_cpu_backward", TRAIN_KINDS) == "attention"
    assert kind_of("aten::relu", TRAIN_KINDS) == "other"
    assert shares_line({"matmul": 3.0, "other": 1.0}) == "matmul 3.00 s (75%), other 1.00 s (25%)"


# -- one run as its own process -----------------------------------------------------------------


def test_a_train_config_crosses_the_process_boundary_as_json_unchanged():
    """`config_to_json` / `config_from_dict` give back the config, nested configs included
    (per-strategy ratios, LoRA, tuples); a field the config lacks, or a bad value, is named."""
    from pipeline.learn.trainer.process import config_from_dict, config_to_json

    loss = LossConfig(kind="ppo", dual_clip=3.0, ratio_by_strategy={"prompt_aug": RatioConfig(mode="truncate", high=2.0)}, sft_strategies=("replay", "x"))
    config = TrainConfig(loss=loss, lora=LoraSettings(r=4, target_modules=("q_proj", "v_proj")), max_length=100, bf16=False, lr=1e-3)
    back = config_from_dict(json.loads(config_to_json(config)))
    assert back == config and back != replace(config, loss=replace(loss, ratio_by_strategy={"prompt_aug": RatioConfig(mode="mask")}))
    assert isinstance(back.loss.ratio_by_strategy["prompt_aug"], RatioConfig) and back.lora.target_modules == ("q_proj", "v_proj")
    assert config_from_dict(json.loads(config_to_json(TrainConfig()))) == TrainConfig()
    assert config_from_dict({"epochs": 3}) == TrainConfig(epochs=3)
    with pytest.raises(ConfigError, match=r"TrainConfig\.loss: unknown field\(s\) \['kindd'\]"):
        config_from_dict({"loss": {"kindd": "ppo"}})
    with pytest.raises(ConfigError, match="LoraSettings.r must be >= 1"):
        config_from_dict({"lora": {"r": 0}})


def test_a_run_in_its_own_process_writes_the_weights_and_result_of_the_run_in_this_one(tok, model, init_dir, tmp_path):
    """`python -m pipeline.learn.trainer` on the view stored as Parquet and the config as JSON
    writes bit for bit the weights `train_policy` writes here, and `train_in_subprocess` returns
    the same `TrainResult`, its wall times aside."""
    import pyarrow.parquet as pq

    from pipeline.learn.trainer import train_in_subprocess
    from pipeline.models import load_model

    view, _ = build_training_view(advantages_table(rows_for(tok, model, 12, seed=41)), {"iid": IID()}, tok)
    path = tmp_path / "view.parquet"
    pq.write_table(view, path)
    loss = LossConfig(kind="ppo", ratio_by_strategy={"iid": RatioConfig(mode="truncate", high=1.5)})
    config = TrainConfig(**{**FAST, "epochs": 2, "minibatch_size": 4, "micro_batch_size": 2}, loss=loss, lr=1e-3)
    here = train_policy(view, "shared", init_dir, tmp_path / "here", config, round_=3)
    there = train_in_subprocess(path, "shared", init_dir, tmp_path / "there", config, round_=3)
    assert here.steps == 6 and here.round == 3 and here.diagnostics.overall.n_rows == 24
    wall = dict(train_seconds=0.0, tokens_per_second=0.0)
    assert replace(there, checkpoint=here.checkpoint, **wall) == replace(here, **wall)
    assert there.checkpoint == tmp_path / "there" and there.mean_loss == here.mean_loss
    ours, theirs = load_model(here.checkpoint).state_dict(), load_model(there.checkpoint).state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert not all(torch.equal(ours[k], v) for k, v in load_model(init_dir).state_dict().items())  # it trained
    assert read_checkpoint_meta(there.checkpoint).config == read_checkpoint_meta(here.checkpoint).config


def test_a_run_in_its_own_process_names_bad_input_in_one_line(init_dir, tmp_path, capsys):
    """Bad input to `python -m pipeline.learn.trainer` exits 2 with one line naming it, and
    writes no checkpoint and no result."""
    from pipeline.learn.trainer.process import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"epochs": 0}))
    argv = ["--view", str(tmp_path / "none.parquet"), "--policy", "shared", "--init", str(init_dir), "--out", str(tmp_path / "out")]
    argv += ["--config", str(config), "--result", str(tmp_path / "result.json")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "python -m pipeline.learn.trainer: error: TrainConfig.epochs must be an integer >= 1, got 0"
    config.write_text("{}")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no training view at" in err and "none.parquet" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "result.json").exists()
