"""`--algorithm` on the commands that run one stage (`maxit advantages`, `view`, `train`) as on
`maxit run`: the preset's reward mix, view and loss, a note naming a strategy the preset's source
does not sample, and a `--help` that says what each algorithm sets."""

from __future__ import annotations

import re

import polars as pl
import pyarrow.parquet as pq
import pytest

from maxit.cli import build_parser, main
from pipeline.run.settings import Settings
from tiny import advantage_row, advantages_table

ADVANTAGE_COLUMNS = ["group_size", "group_mean", "group_std", "advantage", "sample_weight"]


def write_steps(path, rows) -> None:
    pq.write_table(advantages_table(rows).drop_columns(ADVANTAGE_COLUMNS), path)


def team_rows(strategy: str = "iid") -> list[dict]:
    """Two problems x 4 copies, a Solver and a Verifier call each; the team's final reward differs
    from the calls' own rewards; problem q solved by every copy (zero advantages)."""
    rows = []
    for uid, finals in (("p", [1.0, 0.0, 1.0, 1.0]), ("q", [1.0] * 4)):
        for k, g in enumerate(finals):
            for agent, local, step in (("solver", 1.0 - g, 0), ("verifier", 1.0, 1)):
                rows.append(advantage_row(f"{strategy}-{uid}{k}-{agent}", strategy=strategy, uid=uid, traj_uid=f"{strategy}-{uid}{k}", sample_idx=k,
                                          agent_id=agent, step=step, global_reward=g, local_reward=local, reward=None))
    return rows


def test_advantages_takes_the_algorithms_reward_mix_and_groups(tmp_path, capsys):
    """`maxit advantages --algorithm drmas` is DrMAS's reward (the team's final reward on every
    row) and groups, not 0*global + 1*local."""
    steps, out = tmp_path / "steps.parquet", tmp_path / "adv.parquet"
    write_steps(steps, team_rows())
    assert main(["advantages", "--steps", str(steps), "--out", str(out), "--algorithm", "drmas"]) == 0
    said = capsys.readouterr().out
    assert "algorithm drmas" in said and "reward = 1.0*global + 0.0*local" in said and "grouping uid+strategy+agent_id," in said
    adv = pl.read_parquet(out)
    assert (adv["reward"] == adv["global_reward"]).all()
    a = dict(zip(adv["step_id"], adv["advantage"]))
    assert [a[f"iid-p{k}-verifier"] for k in range(4)] == pytest.approx([0.5, -1.5, 0.5, 0.5], abs=1e-5)  # DrMAS's worked example
    # an explicit flag still wins over the preset
    assert main(["advantages", "--steps", str(steps), "--out", str(out), "--algorithm", "drmas", "--alpha", "0", "--local-weight", "1"]) == 0
    assert "reward = 0.0*global + 1.0*local" in capsys.readouterr().out


def test_a_strategy_the_source_does_not_sample_is_named(tmp_path, capsys):
    steps, out = tmp_path / "steps.parquet", tmp_path / "adv.parquet"
    write_steps(steps, team_rows("iid") + team_rows("tree"))
    assert main(["advantages", "--steps", str(steps), "--out", str(out), "--algorithm", "drmas"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("maxit advantages: note:")]
    assert len(notes) == 1 and "strategy 'tree' is not DrMAS's" in notes[0] and "not the team's final reward" in notes[0]
    assert main(["advantages", "--steps", str(steps), "--out", str(out)]) == 0  # maxit's strategies are its own
    assert "note:" not in capsys.readouterr().out


def test_run_names_a_strategy_the_source_does_not_sample_before_it_starts(tmp_path, capsys, monkeypatch):
    import assets.run_rounds

    started = []
    monkeypatch.setattr(assets.run_rounds, "run_rounds", lambda *a, **k: started.append(capsys.readouterr().out) or pl.DataFrame())
    assert main(["run", "--algorithm", "drmas", "--strategies", "iid", "tree", "--store", str(tmp_path / "store"), "--rounds", "1", "--engine", "hf"]) == 0
    assert len(started) == 1 and "maxit run: note: --algorithm drmas: strategy 'tree' is not DrMAS's" in started[0]


def test_view_takes_the_algorithms_view(tmp_path, capsys, default_model_dir):
    """`maxit view --algorithm drmas`: every rewarded row, zero advantages included (verl counts
    their tokens), the Verifier's verdicts not rebalanced; the default (maxit) keeps rs's rows."""
    steps, adv, view = tmp_path / "steps.parquet", tmp_path / "adv.parquet", tmp_path / "view.parquet"
    write_steps(steps, team_rows())
    assert main(["advantages", "--steps", str(steps), "--out", str(adv), "--algorithm", "drmas"]) == 0
    assert main(["view", "--advantages", str(adv), "--out", str(view), "--algorithm", "drmas", "--model-dir", str(default_model_dir)]) == 0
    v = pl.read_parquet(view)
    assert v.height == 16 and (v["advantage"] == 0).sum() == 8 and (v["sample_weight"] == 1.0).all()
    assert main(["view", "--advantages", str(adv), "--out", str(view), "--algorithm", "drmas", "--zero-advantage-rows", "drop",
                 "--model-dir", str(default_model_dir)]) == 0
    assert pl.read_parquet(view).height == 8
    capsys.readouterr()


def test_train_takes_the_algorithms_loss():
    from maxit.cli import settings_of

    parser = build_parser()
    args = parser.parse_args(["train", "--view", "v.parquet", "--policy", "shared", "--out", "ckpt", "--algorithm", "atgrpo"])
    assert settings_of(args, ("algorithm", "loss", "lr")).run_config().train.loss == Settings(algorithm="atgrpo").run_config().train.loss
    args = parser.parse_args(["train", "--view", "v.parquet", "--policy", "shared", "--out", "ckpt"])
    assert settings_of(args, ("algorithm", "loss", "lr")).run_config().train.loss == Settings().run_config().train.loss


def help_of(command: str) -> str:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    return re.sub(r"\s+", " ", sub.format_help())


@pytest.mark.parametrize(
    "flag, said",
    [
        ("--alpha", "drmas, atgrpo, grpo: 1; exit: 0"),
        ("--local-weight", "drmas, grpo: 0; atgrpo, exit: 1"),
        ("--negative-weight", "drmas, atgrpo, exit, grpo: 1"),
        ("--clip-high", "drmas, atgrpo, grpo: 0.2"),
        ("--dual-clip", "drmas, grpo: 3"),
        ("--sequence-ratio", "drmas, atgrpo, exit, grpo: none"),
        ("--zero-advantage-rows", "drmas, atgrpo, exit, grpo: keep"),
    ],
)
def test_help_says_what_each_algorithm_sets(flag, said):
    """Where `--algorithm` presets a setting, its help says each algorithm's value (the sources'
    values written here), not only the `--loss` preset's."""
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    entry = next(a.help for a in run._actions if flag in a.option_strings)
    assert said in entry, entry
    assert "None = the loss's preset" not in help_of("run")


def test_help_of_the_stage_commands_names_the_algorithm():
    for command in ("advantages", "view", "train"):
        assert "--algorithm {maxit,drmas,atgrpo,exit,grpo}" in help_of(command), command
