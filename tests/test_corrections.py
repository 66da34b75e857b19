"""The staleness corrections (`LossConfig.correction`, pipeline/learn/corrections.py) against
their formulas (docs/ALGORITHMS.md, "Staleness corrections"), on hand-built rows whose behaviour
weights w_t = p_old / q are written out: each correction under each loss kind it takes, rows on
both sides of the cap and the lower bound, a padded row whose padding would move W and G if it
counted; "none" is the loss as it was; the trainer computes p_old when a correction is on; bad
settings are refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.config.loss import LossConfig, RatioConfig

from pipeline.config.train import TrainConfig
from pipeline.errors import ConfigError
from pipeline.learn.loss import LossBatch, compute_loss
from pipeline.learn.trainer import train_policy
from pipeline.learn.views import build_training_view
from pipeline.strategies import IID
from test_trainer import FAST, init_dir, model, params, rows_for, tok  # noqa: F401  (fixtures)
from tiny import advantages_table

E = math.exp
NONE = RatioConfig(mode="none")

# log w_t = log p_old - log q of each token; row 3 has two tokens and one padding token, whose
# log w (5.0) would move W and G if the padding counted
LOG_W = [
    [0.2, 0.2, 0.2],  # W = e^0.6 = 1.82 (inside [1/2, 2]), G = e^0.2, every w_t = 1.22
    [0.9, 0.1, 0.2],  # W = e^1.2 = 3.32 (> 2), G = e^0.4 = 1.49; w_0 = e^0.9 = 2.46 > 2
    [-0.3, -0.3, -0.3],  # W = e^-0.9 = 0.41 (< 1/2), G = e^-0.3 = 0.74
    [1.0, 0.6, 5.0],  # two tokens: W = e^1.6 = 4.95 (> 2), G = e^0.8 = 2.23 (> 2); w_0 = e^1 = 2.72 > 2
    [-1.0, -0.6, -0.8],  # W = e^-2.4 = 0.09 (< 1/2), G = e^-0.8 = 0.45 (< 1/2); every w_t < 1
]
LENGTHS = [3, 3, 3, 2, 3]
ADV = [1.0, -0.5, 2.0, 1.5, -1.0]
WEIGHT = [1.0, 1.0, 1.0, 2.0, 1.0]
LOGQ = -1.0  # log q of every token
N_TOKENS = sum(LENGTHS)  # 14

# c of each correction at C = 2, low = 1/2, from the formulas: per row (tis, the masks) or per
# token (token-tis, padding left out)
C_ROW = {
    "tis": [E(0.6), 2.0, E(-0.9), 2.0, E(-2.4)],
    "seq-mask": [1.0, 0.0, 0.0, 0.0, 0.0],
    "geo-mask": [1.0, 1.0, 1.0, 0.0, 0.0],
}
C_TOKEN = [
    [E(0.2), E(0.2), E(0.2)],
    [2.0, E(0.1), E(0.2)],
    [E(-0.3), E(-0.3), E(-0.3)],
    [2.0, E(0.6)],
    [E(-1.0), E(-0.6), E(-0.8)],
]


def c_tokens(correction: str) -> list[list[float]]:
    """c on each completion token of each row."""
    if correction == "token-tis":
        return C_TOKEN
    return [[C_ROW[correction][i]] * n for i, n in enumerate(LENGTHS)]


def batch(delta: float = 0.0, reward=None, strategy=None, old: bool = True) -> LossBatch:
    """The rows above: log q = -1, log p_old = -1 + log w, log p_theta = log p_old + `delta`."""
    old_logp = torch.tensor([[LOGQ + x for x in row] for row in LOG_W], dtype=torch.float64)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(3)] for n in LENGTHS], dtype=torch.float64)
    return LossBatch(
        logp=(old_logp + delta).clone().requires_grad_(True),
        logq=torch.full((5, 3), LOGQ, dtype=torch.float64),
        mask=mask,
        advantage=torch.tensor(ADV, dtype=torch.float64),
        sample_weight=torch.tensor(WEIGHT, dtype=torch.float64),
        reward=torch.tensor(reward or [1.0] * 5, dtype=torch.float64),
        strategy=strategy or ["iid"] * 5,
        agent=["solver"] * 5,
        old_logp=old_logp if old else None,
    )


def grads(b: LossBatch) -> list[list[float]]:
    return [[b.logp.grad[i, t].item() for t in range(3)] for i in range(5)]


CORRECTIONS = ["tis", "token-tis", "seq-mask", "geo-mask"]


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_ppo_and_is_weight_each_token_by_c_and_take_p_theta_over_p_old_as_their_ratio(correction):
    """"ppo" at p_theta = p_old: the ratio is 1 (against q it would be up to e^1.6 and clipped),
    so the token loss is -A w c, token mean over all 14 tokens (masked rows still counted), and
    each token's gradient -A w c / 14; padding gets none. "is" with p_theta = p_old e^0.05:
    -e^0.05 A w c per token."""
    c = c_tokens(correction)
    b = batch()
    out = compute_loss(b, LossConfig(kind="ppo", ratio=NONE, correction=correction))
    out.loss.backward()
    expected = -sum(ADV[i] * WEIGHT[i] * c[i][t] for i in range(5) for t in range(LENGTHS[i])) / N_TOKENS
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    want = [[-ADV[i] * WEIGHT[i] * c[i][t] / N_TOKENS if t < LENGTHS[i] else 0.0 for t in range(3)] for i in range(5)]
    for got_row, want_row in zip(grads(b), want):
        assert got_row == pytest.approx(want_row, rel=1e-12, abs=1e-15)
    assert out.diagnostics.overall.n_clipped_tokens == 0

    b = batch(delta=0.05)
    out = compute_loss(b, LossConfig(kind="is", ratio=NONE, correction=correction))
    expected = -sum(E(0.05) * ADV[i] * WEIGHT[i] * c[i][t] for i in range(5) for t in range(LENGTHS[i])) / N_TOKENS
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("correction", ["tis", "seq-mask", "geo-mask"])
def test_exit_multiplies_each_rows_update_ratio_by_its_c(correction):
    """"exit": row loss -r_i c_i A_i w_i, r_i = exp(sum_t log p_theta - log p_old) = e^(0.05 n_i)
    not detached, mean over the 5 rows; each token's gradient -r_i c_i A_i w_i / 5."""
    c = C_ROW[correction]
    b = batch(delta=0.05)
    out = compute_loss(b, LossConfig(kind="exit", correction=correction))
    out.loss.backward()
    r = [E(0.05 * n) for n in LENGTHS]
    assert out.loss.item() == pytest.approx(-sum(r[i] * c[i] * ADV[i] * WEIGHT[i] for i in range(5)) / 5, rel=1e-12)
    want = [[-r[i] * c[i] * ADV[i] * WEIGHT[i] / 5 if t < LENGTHS[i] else 0.0 for t in range(3)] for i in range(5)]
    for got_row, want_row in zip(grads(b), want):
        assert got_row == pytest.approx(want_row, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_rs_weights_the_nll_of_the_passing_rows_by_c(correction):
    """"rs": -log p_theta * w * c per token of the rows with reward >= 1 (row 2 fails: reward 0),
    token mean over the passing rows' 11 tokens."""
    c = c_tokens(correction)
    reward = [1.0, 1.0, 0.0, 1.0, 1.0]
    out = compute_loss(batch(reward=reward), LossConfig(kind="rs", correction=correction))
    passing = [i for i in range(5) if reward[i] >= 1.0]
    logp = [[LOGQ + x for x in row] for row in LOG_W]
    expected = sum(-logp[i][t] * WEIGHT[i] * c[i][t] for i in passing for t in range(LENGTHS[i])) / sum(LENGTHS[i] for i in passing)
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("correction", "masked", "truncated_rows", "truncated_tokens"),
    [("tis", 0, 2, 0), ("token-tis", 0, 0, 2), ("seq-mask", 4, 0, 0), ("geo-mask", 2, 0, 0)],
)
def test_the_diagnostics_count_what_each_correction_did(correction, masked, truncated_rows, truncated_tokens):
    """tis truncates rows 1 and 3 (W > 2); token-tis the first tokens of rows 1 and 3 (not row
    3's padding, w = e^5); seq-mask masks rows 1-4 (W outside [1/2, 2]); geo-mask rows 3 and 4.
    Under "rs" only the rows it trains count (row 3 failing: one row fewer for tis and both masks)."""
    d = compute_loss(batch(), LossConfig(kind="ppo", ratio=NONE, correction=correction)).diagnostics.overall
    assert (d.n_masked_rows, d.n_truncated_rows, d.n_truncated_tokens) == (masked, truncated_rows, truncated_tokens)
    assert d.truncated_token_fraction == truncated_tokens / N_TOKENS and d.masked_fraction == masked / 5
    rs = compute_loss(batch(reward=[1.0, 1.0, 1.0, 0.0, 1.0]), LossConfig(kind="rs", correction=correction)).diagnostics.overall
    assert (rs.n_masked_rows, rs.n_truncated_rows, rs.n_truncated_tokens) == (max(masked - 1, 0), max(truncated_rows - 1, 0), max(truncated_tokens - 1, 0))


def test_the_bounds_are_the_settings():
    """C = 3.5 and low = 0.4: seq-mask keeps rows 1 (W = 3.32 <= 3.5) and 2 (W = 0.41 >= 0.4)
    and masks rows 3 (4.95 > 3.5) and 4 (0.09 < 0.4); tis truncates row 3 alone, at 3.5."""
    cfg = LossConfig(kind="ppo", ratio=NONE, correction="seq-mask", correction_cap=3.5, correction_low=0.4)
    assert cfg.correction_bounds == (0.4, 3.5) and LossConfig().correction_bounds == (0.5, 2.0)
    d = compute_loss(batch(), cfg).diagnostics.overall
    assert d.n_masked_rows == 2
    out = compute_loss(batch(), LossConfig(kind="ppo", ratio=NONE, correction="tis", correction_cap=3.5))
    c = [E(0.6), E(1.2), E(-0.9), 3.5, E(-2.4)]
    assert out.loss.item() == pytest.approx(-sum(ADV[i] * WEIGHT[i] * c[i] * LENGTHS[i] for i in range(5)) / N_TOKENS, rel=1e-12)
    assert out.diagnostics.overall.n_truncated_rows == 1


def test_replay_rows_are_trained_by_their_nll_without_c():
    """A row of `sft_strategies` (the Verifier's relabelled replay) has no behaviour ratio: its
    NLL is not weighted and it is not counted as masked, under ppo and under rs."""
    strategy = ["iid", "iid", "iid", "replay", "iid"]
    d = compute_loss(batch(strategy=strategy), LossConfig(kind="ppo", ratio=NONE, correction="geo-mask")).diagnostics.overall
    assert d.n_masked_rows == 1  # row 4 only
    out = compute_loss(batch(strategy=strategy), LossConfig(kind="rs", correction="geo-mask"))
    logp = [[LOGQ + x for x in row] for row in LOG_W]
    c = C_ROW["geo-mask"]
    expected = sum(-logp[i][t] * WEIGHT[i] * (1.0 if i == 3 else c[i]) for i in range(5) for t in range(LENGTHS[i])) / N_TOKENS
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    assert out.diagnostics.overall.n_masked_rows == 1


@pytest.mark.parametrize("kind", ["rs", "ppo", "is", "exit"])
def test_none_is_the_loss_as_it_was(kind):
    """correction="none" (whatever its cap and bound) is the loss without a correction, bit for
    bit, loss and gradient, whether or not the batch carries p_old; under "ppo" / "is" it is the
    plain loss against q (row 3's first token, ratio e^1 against q with A > 0, is clipped under "ppo")."""
    plain = LossConfig(kind=kind)
    given = LossConfig(kind=kind, correction="none", correction_cap=7.0, correction_low=0.2)
    assert not plain.needs_old_logp and not given.needs_old_logp
    a, b = batch(old=False), batch()
    out_a, out_b = compute_loss(a, plain), compute_loss(b, given)
    out_a.loss.backward()
    out_b.loss.backward()
    assert out_a.loss.item() == out_b.loss.item() and torch.equal(a.logp.grad, b.logp.grad)
    assert out_a.diagnostics == out_b.diagnostics and out_b.diagnostics.overall.n_truncated_tokens == 0
    if kind == "ppo":
        assert out_a.diagnostics.overall.n_clipped_tokens > 0


def test_a_correction_needs_p_old_in_the_batch():
    for kind in ("rs", "ppo", "is", "exit"):
        cfg = LossConfig(kind=kind, correction="tis")
        assert cfg.needs_old_logp
        with pytest.raises(ValueError, match="old_logp"):
            compute_loss(batch(old=False), cfg)
    assert LossConfig(kind="ppo", anchor="proximal").needs_old_logp and not LossConfig(kind="rs", anchor="proximal").needs_old_logp


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(correction="truncate"), "LossConfig.correction"),
        (dict(correction="tis", correction_cap=0.5), "LossConfig.correction_cap"),
        (dict(correction_cap=float("nan")), "LossConfig.correction_cap"),
        (dict(correction_cap=True), "LossConfig.correction_cap"),
        (dict(correction="seq-mask", correction_low=2.0), "LossConfig.correction_low"),
        (dict(correction="geo-mask", correction_low=0.0), "LossConfig.correction_low"),
        (dict(kind="exit", correction="token-tis"), "LossConfig.correction"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        LossConfig(**kwargs)


def test_the_flags_name_the_setting():
    from pipeline.run.settings import Settings

    with pytest.raises(ConfigError, match="--correction-cap"):
        Settings(correction_cap=0.5).run_config()
    with pytest.raises(ConfigError, match="--correction-low"):
        Settings(off_policy_correction="geo-mask", correction_low=1.5).run_config()
    loss = Settings(off_policy_correction="token-tis", correction_cap=3.0).run_config().train.loss
    assert (loss.correction, loss.correction_bounds) == ("token-tis", (1.0 / 3.0, 3.0))


def test_the_trainer_computes_p_old_for_a_correction(tok, model, init_dir, tmp_path):
    """Rows sampled by an older policy: q is e^0.5 times the model's probability on every token,
    so W = e^(-0.5 n) < 1/2 for every row (3 tokens or more). Under "rs", seq-mask (which needs
    p_old, computed by the trainer before the first step) masks every row: nothing moves. The
    same rows under geo-mask with bounds [0.5, 2] (G = e^-0.5 = 0.61 inside) train, as without a
    correction."""
    rows = rows_for(tok, model, 8, seed=31, reward=1.0)
    for r in rows:
        r["completion_logprobs"] = [x + 0.5 for x in r["completion_logprobs"]]
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok)
    before = params(model)

    def moved(path) -> bool:
        after = params(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
        return any(not torch.equal(before[k], after[k]) for k in before)

    masked = train_policy(view, "shared", init_dir, tmp_path / "seq", TrainConfig(**FAST, loss=LossConfig(kind="rs", correction="seq-mask")))
    first = masked.first_step_diagnostics.overall
    assert first.n_rows == 8 and first.n_masked_rows == 8
    assert first.mean_log_ratio == pytest.approx(-0.5, abs=1e-4)
    assert not moved(tmp_path / "seq")
    kept = train_policy(view, "shared", init_dir, tmp_path / "geo", TrainConfig(**FAST, loss=LossConfig(kind="rs", correction="geo-mask")))
    assert kept.first_step_diagnostics.overall.n_masked_rows == 0
    assert moved(tmp_path / "geo")


@pytest.mark.parametrize("kind", ["rs", "ppo", "is", "exit"])
@pytest.mark.parametrize("old", [False, True])
def test_none_is_the_loss_of_the_commit_before_corrections(kind, old):
    """correction="none" (whatever its cap and bound) against tests/data/loss_before_corrections.json:
    the loss and gradient the loss code computed before the corrections landed (commit 1cf919b,
    written by tests/data/loss_before_corrections.py), bit for bit, with and without p_old in
    the batch."""
    import importlib.util
    import json
    from pathlib import Path

    here = Path(__file__).resolve().parent / "data"
    stored = json.loads((here / "loss_before_corrections.json").read_text())
    assert stored["commit"] == "1cf919b"
    spec = importlib.util.spec_from_file_location("loss_before_corrections", here / "loss_before_corrections.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    values = maker.values
    config = LossConfig(kind=kind, correction="none", correction_cap=7.0, correction_low=0.2)
    assert values(kind, old, config) == stored["losses"][kind]["with_p_old" if old else "without_p_old"]
