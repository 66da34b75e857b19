"""Each algorithm preset (`--algorithm`) against a plain implementation of its source on small
hand-built inputs: DrMAS's worked example (per-agent groups, the team's final reward on every
row), AT-GRPO's tree groups and mixed reward, the expert-iteration plan (centred advantages,
stratified w_s / n_s, feedback's first attempt at weight 0, hint and feedback out of the training
context), plain GRPO (one member per trajectory). The losses' own references are in
tests/test_loss_reference.py; tests/test_preset_sources.py takes each preset through its
advantages, view and loss against its source, with the source's constants written there."""

from __future__ import annotations

import math
import statistics

import polars as pl
import pytest

from pipeline.learn.advantages import compute_advantages
from pipeline.models.chat import encode_prompt
from pipeline.config.presets import ALGORITHM_PRESETS
from pipeline.run.settings import Settings
from pipeline.strategies import make_strategy
from pipeline.learn.views import build_training_view
from tiny import advantage_row, advantages_table, tiny_tokenizer

EPS = 1e-6


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def steps(rows: list[dict]) -> pl.DataFrame:
    drop = ["group_size", "group_mean", "group_std", "advantage", "sample_weight"]
    return pl.from_arrow(advantages_table(rows)).drop(drop)


def grpo(values: list[float]) -> list[float]:
    """GRPO's advantage of each member: (r - mean) / (unbiased std + eps); 0 for a degenerate group."""
    if len(values) < 2 or max(values) == min(values):
        return [0.0] * len(values)
    m, s = statistics.mean(values), statistics.stdev(values)
    return [(v - m) / (s + EPS) for v in values]


def advantages(algorithm: str, rows: list[dict]) -> dict[str, float]:
    out = compute_advantages(steps(rows), Settings(algorithm=algorithm).run_config().advantage)
    return dict(zip(out["step_id"], out["advantage"]))


def drmas_example(loops: dict[int, int] | None = None, policies: tuple[str, str] = ("shared", "shared")) -> list[dict]:
    """DrMAS's worked example: K = 4 copies of one problem, final team rewards [1, 0, 1, 1]; each
    trajectory a Solver call and a Verifier call per loop (`loops[k]` loops for copy k). Local
    rewards differ from the team's, so a preset that mixed them in would show."""
    final = [1.0, 0.0, 1.0, 1.0]
    rows = []
    for k, g in enumerate(final):
        for t in range((loops or {}).get(k, 1)):
            for agent, policy, local in (("solver", policies[0], 1.0 - g), ("verifier", policies[1], 0.5)):
                rows.append(advantage_row(f"k{k}-{agent}-t{t}", uid="p", traj_uid=f"k{k}", sample_idx=k, agent_id=agent, policy_id=policy, turn=t,
                                          step=2 * t + (agent == "verifier"), global_reward=g, local_reward=local, reward=None))
    return rows


def test_drmas_is_its_worked_example_per_agent_with_the_team_reward_on_every_row():
    got = advantages("drmas", drmas_example())
    for agent in ("solver", "verifier"):
        assert [got[f"k{k}-{agent}-t0"] for k in range(4)] == pytest.approx([0.5, -1.5, 0.5, 0.5], abs=1e-5)


@pytest.mark.parametrize("policies", [("shared", "shared"), ("solver", "verifier")])
def test_drmas_multi_loop_counts_every_call_in_its_agents_group(policies):
    rows = drmas_example(loops={1: 3, 2: 2}, policies=policies)  # copy 1 looped three times, copy 2 twice
    got = advantages("drmas", rows)
    for agent in ("solver", "verifier"):
        mine = [r for r in rows if r["agent_id"] == agent]
        want = dict(zip([r["step_id"] for r in mine], grpo([r["global_reward"] for r in mine])))  # DrMAS: every call a member, team reward
        assert len(want) == 1 + 3 + 2 + 1  # every call of the looped copies
        assert {k: got[k] for k in want} == pytest.approx(want, abs=1e-6)


def test_grpo_is_one_member_per_trajectory():
    """Plain GRPO on the same example: one group per problem over trajectories: 0.5, not the
    per-row 0.540 that the Solver and Verifier rows counted separately would give."""
    got = advantages("grpo", drmas_example())
    assert [got[f"k{k}-solver-t0"] for k in range(4)] == pytest.approx([0.5, -1.5, 0.5, 0.5], abs=1e-5)
    per_row = grpo([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert per_row[0] == pytest.approx(0.540, abs=1e-3) and got["k0-solver-t0"] != pytest.approx(per_row[0], abs=1e-3)


def tree_rows() -> list[dict]:
    """An AT-GRPO tree: N = 3 candidates per node, two turns, Solver then Verifier. Each
    candidate's global reward is the state's right after its step, its local its own."""
    spec = {  # (agent, turn) -> [(global, local)] of the N siblings
        ("solver", 0): [(1.0, 1.0), (0.0, 0.0), (0.0, 0.0)],
        ("verifier", 0): [(1.0, 1.0), (1.0, 0.0), (1.0, 1.0)],
        ("solver", 1): [(0.0, 0.0), (1.0, 1.0), (1.0, 1.0)],
        ("verifier", 1): [(1.0, 0.0), (1.0, 0.0), (1.0, 0.0)],
    }
    rows = []
    for (agent, t), cands in spec.items():
        for i, (g, l) in enumerate(cands):
            rows.append(advantage_row(f"{agent}-t{t}-c{i}", strategy="tree", uid="p", traj_uid=f"b{i}", sample_idx=i, agent_id=agent, turn=t,
                                      step=2 * t + (agent == "verifier"), global_reward=g, local_reward=l, reward=None, selected=i == 0))
    return rows, spec


def test_atgrpo_groups_the_siblings_of_each_node_by_agent_and_turn_with_the_mixed_reward():
    rows, spec = tree_rows()
    got = advantages("atgrpo", rows)
    alpha = 1.0  # AT-GRPO: alpha * global + local (its alpha is left open; docs/ALGORITHMS.md gives 1)
    for (agent, t), cands in spec.items():
        mixed = [alpha * g + l for g, l in cands]
        assert [got[f"{agent}-t{t}-c{i}"] for i in range(3)] == pytest.approx(grpo(mixed), abs=1e-6)
    assert Settings(algorithm="atgrpo").run_config().strategies == ("tree",)


def test_exit_centres_within_strategy_groups_and_weights_each_strategy_by_w_s_over_n_s(tok):
    """The plan: A = r - mean within the group (one problem, one strategy); each row scaled by
    w_s / n_s with N / sum w normalising the mean weight to 1; feedback's first attempt at weight 0;
    the hint and the feedback out of the training context."""
    config = Settings(algorithm="exit").run_config()
    problem = {"role": "user", "content": "5+5="}
    hint = {"role": "system", "content": "Hint: ten"}
    fb_ctx = [problem, {"role": "assistant", "content": "11"}, {"role": "user", "content": "Wrong, try again."}]
    rows = [advantage_row(f"i{k}", strategy="iid", local_reward=r, global_reward=r, reward=None) for k, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    rows += [advantage_row(f"h{k}", strategy="prompt_aug", local_reward=r, global_reward=r, reward=None, sampling_messages=[hint, problem],
                           prompt_ids=encode_prompt(tok, [hint, problem])) for k, r in enumerate([1.0, 0.0])]
    rows += [advantage_row(f"f{k}-t0", strategy="feedback", traj_uid=f"f{k}", local_reward=0.0, global_reward=0.0, reward=None) for k in range(2)]
    rows += [advantage_row(f"f{k}-t1", strategy="feedback", traj_uid=f"f{k}", turn=1, step=2, local_reward=r, global_reward=r, reward=None,
                           sampling_messages=fb_ctx, prompt_ids=encode_prompt(tok, fb_ctx)) for k, r in enumerate([1.0, 0.0])]
    adv = compute_advantages(steps(rows), config.advantage)
    got = dict(zip(adv["step_id"], adv["advantage"]))
    assert [got[f"i{k}"] for k in range(4)] == pytest.approx([0.75, -0.25, -0.25, -0.25])  # centred, not divided by the std
    assert [got["h0"], got["h1"]] == pytest.approx([0.5, -0.5])
    strategies = {s: make_strategy(s, group_size=4, **dict(config.strategy_options).get(s, {})) for s in config.strategies}
    view, stats = build_training_view(adv.to_arrow(), strategies, tok, config.view)
    w = dict(zip(view.column("step_id").to_pylist(), view.column("sample_weight").to_pylist()))
    assert not any(k.endswith("-t0") and k.startswith("f") for k in w) and stats.n_not_trainable == 2  # attempt 1: weight 0
    # n_s: iid 4, prompt_aug 2, feedback 2 (its second attempts); N = 8, w_s = 1/3 each
    n = {"i": 4, "h": 2, "f": 2}
    assert all(w[k] == pytest.approx(8 / 3 / n[k[0]]) for k in w)
    prompts = dict(zip(view.column("step_id").to_pylist(), view.column("train_prompt_ids").to_pylist()))
    assert prompts["h0"] == encode_prompt(tok, [problem]) and prompts["f0-t1"] == encode_prompt(tok, [problem])
    loss = config.train.loss
    assert loss.kind == "exit" and loss.ratio.mode == "none" and not dict(loss.ratio_by_strategy)


def test_every_preset_is_documented_as_the_code_has_it():
    """docs/ALGORITHMS.md's preset table lists every algorithm with the values the code sets."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "ALGORITHMS.md").read_text()
    table = text[text.index("<!-- presets -->"): text.index("<!-- /presets -->")]
    lines = [l for l in table.splitlines() if l.startswith("| `")]
    names = [l.split("|")[1].strip().strip("`") for l in lines]
    keys = [h.strip().strip("`") for h in table.splitlines()[1].split("|")[2:-1]]
    assert names == list(ALGORITHM_PRESETS)
    for line, name in zip(lines, names):
        cells = [c.strip() for c in line.split("|")[2:-1]]
        for key, cell in zip(keys, cells):
            value = getattr(Settings(algorithm=name), key)
            unset = {"dual_clip": "off", "hinted_rows": "(sequence_ratio)", "feedback_rows": "(sequence_ratio)"}.get(key, "(the loss's)")
            shown = unset if value is None else " ".join(value) if isinstance(value, tuple) else str(value)
            assert cell.strip("`") == (shown or "none"), f"{name}.{key}: docs say {cell!r}, the code {shown!r}"


def test_verdict_balancing_is_on_for_rs_only_unless_asked_for():
    """Balancing rescales rows after the advantages: under a policy gradient the groups' A * w
    would no longer sum to 0, so it is the rs loss's alone by default."""
    assert Settings().view_config().balance_verdicts is True
    for loss in ("ppo", "is", "exit"):
        assert Settings(loss=loss).view_config().balance_verdicts is False
    assert Settings(loss="ppo", balance_verdicts=True).view_config().balance_verdicts is True


@pytest.mark.parametrize("algorithm", ["drmas", "atgrpo", "exit", "grpo"])
def test_each_algorithm_runs_a_whole_round(tmp_path, default_model_dir, algorithm):
    """Every preset runs its round end to end (rollouts, advantages, view, training, evaluation)
    with the strategies, groups and loss it names."""
    import polars as pl

    from pipeline.store.registry import PolicyRegistry
    from pipeline.engines.pool import EnginePool
    from pipeline.run.context import RoundContext
    from pipeline.run.rounds import run_round_stages

    settings = Settings(algorithm=algorithm, model_dir=str(default_model_dir), problems=6, samples=2, eval_problems=8, eval_samples=1,
                        epochs=1, minibatch_size=64, micro_batch_size=32)
    ctx = RoundContext(tmp_path, settings.run_config(), EnginePool("hf"))
    try:
        out = run_round_stages(ctx, 0)
    finally:
        ctx.engines.close()
    steps = pl.from_arrow(out["rollouts"]) if not isinstance(out["rollouts"], pl.DataFrame) else out["rollouts"]
    assert set(steps["strategy"]) == set(ALGORITHM_PRESETS[algorithm]["strategies"])
    assert PolicyRegistry(tmp_path).get(0, "shared") is not None
    ratio = pl.read_parquet(tmp_path / "round=0" / "ratio_diagnostics.parquet")
    assert ratio.height > 0  # a policy-gradient loss trained rows with importance ratios
