"""Settings against long runs' drift (docs/results/long-runs.md): each reaches its config from the
flag, a bad value is one error naming the flag, and the problems stage and the registry do what
they say."""

from __future__ import annotations

import polars as pl
import pytest

from assets.config import RunSettings
from maxit.cli import build_parser, main
from pipeline.config import RunConfig
from pipeline.errors import ConfigError
from pipeline.run.checkpoints import best_round
from pipeline.run.context import RoundContext
from pipeline.run.context import build_workflow
from pipeline.run.problems import draw_problems, replay_candidates
from pipeline.run.rounds import stage_problems
from pipeline.run.settings import Settings, settings_from_args
from pipeline.store import Tables


def cli_settings(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["run", *argv]))


def test_kl_beta_reaches_the_loss(tmp_path, capsys):
    assert Settings().run_config().train.loss.beta == 0.0
    s = cli_settings("--kl-beta", "0.5")
    assert s.run_config().train.loss.beta == 0.5
    assert RunSettings.from_settings(s).run_config() == s.run_config()
    with pytest.raises(ConfigError, match="--kl-beta must be finite and >= 0"):
        Settings(kl_beta=-1.0).run_config()
    assert main(["run", "--rounds", "1", "--store", str(tmp_path / "s"), "--kl-beta", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--kl-beta" in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()


def test_lr_round_decay_sets_each_rounds_learning_rate():
    train = cli_settings("--lr-round-decay", "0.5").run_config().train
    assert train.lr_round_decay == 0.5
    assert [train.for_round(r).lr for r in (-1, 0, 1, 3)] == [5e-4, 5e-4, 2.5e-4, 5e-4 / 8]
    assert train.for_round(3).loss == train.loss and train.for_round(3).epochs == train.epochs
    plain = Settings().run_config().train
    assert plain.lr_round_decay == 1.0 and plain.for_round(7) is plain
    with pytest.raises(ConfigError, match=r"--lr-round-decay must be in \(0, 1\]"):
        Settings(lr_round_decay=1.5).run_config()


def _steps(rows):
    """steps rows (round, uid, step, strategy, local_reward), all active."""
    return pl.DataFrame(
        [{"round": r, "uid": u, "step": st, "strategy": s, "active": True, "local_reward": v} for r, u, st, s, v in rows],
        schema={"round": pl.Int32, "uid": pl.String, "step": pl.Int32, "strategy": pl.String, "active": pl.Boolean, "local_reward": pl.Float64},
    )


def _hard_cases(p0, p1):
    a, b, c, d = p0["uid"].to_list()
    e = p1["uid"][0]
    steps = _steps([
        (0, a, 0, "iid", 0.0), (0, a, 0, "iid", 0.0), (0, a, 0, "prompt_aug", 1.0),  # 0/2 unhinted
        (0, b, 0, "iid", 1.0), (0, b, 0, "tree", 0.0),                                # 1/2
        (0, c, 0, "iid", 1.0), (0, c, 2, "iid", 0.0),                                 # 1/1 at step 0: solved
        (0, d, 0, "iid", 0.0), (1, d, 0, "iid", 1.0),                                 # solved when drawn again
        (1, e, 0, "iid", 0.5),                                                        # 0.5, newer than b
    ])
    return steps, [a, e, b]


def test_replay_candidates_are_the_hardest_latest_problems():
    wf = build_workflow(RunConfig())
    p0, p1 = draw_problems(wf, 4, 1, 0), draw_problems(wf, 4, 2, 1)
    steps, hardest = _hard_cases(p0, p1)
    problems = pl.concat([p0, p1])
    out = replay_candidates(problems, steps, 10)
    assert out["uid"].to_list() == hardest
    assert out.columns == problems.columns
    assert replay_candidates(problems, steps, 2)["uid"].to_list() == hardest[:2]
    # the round's draw: the replayed problems first, then fresh ones, n in all, none twice
    fresh = draw_problems(wf, 6, 7, 2)
    drawn = draw_problems(wf, 6, 7, 2, replay=out)
    assert drawn.height == 6 and drawn["uid"].n_unique() == 6
    assert drawn["uid"].to_list()[:3] == hardest
    assert set(drawn["uid"].to_list()[3:]) <= set(draw_problems(wf, 9, 7, 2)["uid"].to_list())
    assert (drawn["round"] == 2).all() and (drawn["split"] == "train").all()
    assert draw_problems(wf, 6, 7, 2, replay=out.head(0)).equals(fresh)


def test_the_problems_stage_replays_the_stores_hardest(tmp_path):
    """Round 2's problems stage reads rounds 0 and 1's problems and steps from the store: a share
    `problem_replay` of its problems are their hardest, the rest its own fresh draw; off, all fresh."""
    config = Settings(problems=8, problem_replay=0.25).run_config()
    wf = build_workflow(config)
    p0, p1 = draw_problems(wf, 4, 1, 0), draw_problems(wf, 4, 2, 1)
    steps, hardest = _hard_cases(p0, p1)
    tables = Tables(tmp_path)
    for r, problems in ((0, p0), (1, p1)):
        tables.write(r, "problems", problems)
        steps.filter(pl.col("round") == r).write_parquet(tables.path(r, "steps"))
    ctx = RoundContext(tables, config)
    drawn = stage_problems(ctx, 2)
    assert drawn.height == 8 and drawn["uid"].to_list()[:2] == hardest[:2]  # round(8 * 0.25) = 2
    assert drawn["uid"].n_unique() == 8 and (drawn["round"] == 2).all()
    assert tables.read(2, "problems").equals(drawn)
    fresh = draw_problems(wf, 8, ctx.round_seed(2, 1), 2)
    assert drawn["uid"].to_list()[2:] == [u for u in fresh["uid"].to_list() if u not in hardest[:2]][:6]
    off = RoundContext(Tables(tmp_path), Settings(problems=8, problem_replay=0.0).run_config())
    assert stage_problems(off, 2).equals(fresh)
    # round 0 has no earlier round: a fresh draw whatever the share
    assert stage_problems(RoundContext(Tables(tmp_path / "new"), config), 0).equals(draw_problems(wf, 8, ctx.round_seed(0, 1), 0))


def test_problem_replay_setting():
    assert Settings().run_config().problem_replay == RunConfig().problem_replay == 0.25
    assert cli_settings("--problem-replay", "0").run_config().problem_replay == 0.0
    with pytest.raises(ConfigError, match=r"--problem-replay must be a share in \[0, 1\)"):
        Settings(problem_replay=1.0).run_config()


def test_best_round_is_the_highest_mean_of_the_table_metrics():
    def ev(r, acc, bal, hint=0.0):
        return [
            {"round": r, "agent_id": "solver", "metric": "accuracy", "value": acc},
            {"round": r, "agent_id": "verifier", "metric": "verdict_balanced_accuracy", "value": bal},
            {"round": r, "agent_id": "verifier", "metric": "approve_rate", "value": hint},
        ]

    rows = pl.DataFrame(ev(-1, 0.4, 0.5) + ev(0, 0.9, 0.7) + ev(1, 0.8, 0.9, hint=1.0) + ev(2, 0.95, 0.6))
    metrics = [("solver", "accuracy"), ("verifier", "verdict_balanced_accuracy")]
    assert best_round(rows, metrics) == 1  # 0.85 > 0.8 (round 0) and 0.775 (round 2); approve_rate is not counted
    assert best_round(rows, metrics[:1]) == 2
    tie = pl.concat([rows, pl.DataFrame(ev(3, 0.8, 0.9))])
    assert best_round(tie, metrics) == 3  # the latest among equals
    assert best_round(rows, [("team", "success")]) is None


def test_start_from_setting():
    assert Settings().run_config().start_from == "last"
    assert cli_settings("--start-from", "best").run_config().start_from == "best"
    with pytest.raises(ConfigError, match="start_from must be one of"):
        Settings(start_from="first")


def test_a_round_starts_from_the_best_evaluated_checkpoint(tmp_path):
    tables = Tables(tmp_path)

    def make(start_from):
        ctx = RoundContext(tables, Settings(start_from=start_from).run_config())
        for r in (-1, 0, 1):
            folder = tmp_path / "ckpt" / str(r)
            folder.mkdir(parents=True, exist_ok=True)
            ctx.registry.register(r, "shared", folder)
        return ctx

    for r, acc in ((-1, 0.4), (0, 0.9), (1, 0.7)):
        row = {"round": r, "policy_id": "shared", "agent_id": "solver", "split": "heldout", "metric": "accuracy", "value": acc, "n": 400}
        tables.write(r, "evaluation", pl.DataFrame([row]).cast({"round": pl.Int32}))
    assert make("last").checkpoints.start_checkpoints(2)["shared"] == (tmp_path / "ckpt" / "1").resolve()
    best = make("best")
    assert best.checkpoints.start_checkpoints(2)["shared"] == (tmp_path / "ckpt" / "0").resolve()
    assert best.checkpoints.start_checkpoints(1)["shared"] == (tmp_path / "ckpt" / "0").resolve()
    assert best.checkpoints.start_checkpoints(0)["shared"] == (tmp_path / "ckpt" / "-1").resolve()


def test_the_policy_stage_trains_each_round_at_its_decayed_rate(tmp_path, monkeypatch):
    """stage_policy hands the trainer the round's config (`TrainConfig.for_round`), not the run's."""
    import types

    import pipeline.learn.trainer as trainer
    from pipeline.run.rounds import stage_policy

    seen = []

    def fake_train(view, pid, parent, out_dir, config, round_):
        seen.append((round_, config.lr))
        out_dir.mkdir(parents=True, exist_ok=True)
        empty = types.SimpleNamespace(overall=types.SimpleNamespace(n_rows=0), by_agent={}, by_strategy={})
        return types.SimpleNamespace(checkpoint=out_dir, data_hash="h", diagnostics=empty, first_step_diagnostics=None,
                                     steps=1, n_rows=1, mean_loss=0.1, tokens_per_second=1.0)

    monkeypatch.setattr(trainer, "train_policy", fake_train)
    ctx = RoundContext(Tables(tmp_path), Settings(lr_round_decay=0.5).run_config())
    for r in (0, 1, 2):
        stage_policy(ctx, r, view=None)
    assert seen == [(0, 5e-4), (1, 2.5e-4), (2, 1.25e-4)]
