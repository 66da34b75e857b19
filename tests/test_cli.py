"""The command line, as a user runs it: `maxit rollout -> advantages -> view -> train` on the
default model, and bad input answered with exit code 2, an error naming the flag or column, and
nothing written."""

from __future__ import annotations

from pathlib import Path


import polars as pl
import pytest

from conftest import require_vllm
from maxit.cli import main
from pipeline.store.registry import PolicyRegistry
from pipeline.learn.trainer import read_checkpoint_meta
from schemas import ADVANTAGES, STEPS, TRAINING_VIEW, validate


@pytest.fixture(scope="module")
def rolled_out(tmp_path_factory, default_model_dir):
    """`maxit rollout` with the HF engine on the warm-started default model."""
    store = tmp_path_factory.mktemp("cli-store")
    rc = main(["rollout", "--store", str(store), "--round", "0", "--problems", "6", "--samples", "2", "--engine", "hf", "--model-dir", str(default_model_dir)])
    assert rc == 0
    return store


def test_rollout_writes_a_valid_mixed_strategy_two_agent_round(rolled_out):
    steps = pl.read_parquet(rolled_out / "round=0" / "steps.parquet")
    validate(steps, STEPS)
    assert set(steps["strategy"]) == {"iid", "prompt_aug", "feedback", "tree"}
    assert set(steps["agent_id"]) == {"solver", "verifier"}
    assert set(steps["engine"]) == {"hf"}


@pytest.mark.vllm
def test_rollout_with_vllm(tmp_path, default_model_dir):
    require_vllm()
    rc = main(["rollout", "--store", str(tmp_path), "--problems", "4", "--samples", "2", "--engine", "vllm", "--model-dir", str(default_model_dir)])
    assert rc == 0
    steps = validate(pl.read_parquet(tmp_path / "round=0" / "steps.parquet"), STEPS)
    assert set(steps["engine"]) == {"vllm"} and set(steps["agent_id"]) == {"solver", "verifier"}
    assert (steps["completion_ids"].list.len() == steps["completion_logprobs"].list.len()).all()


def test_advantages_view_train_from_a_real_steps_table(rolled_out, tmp_path, default_model_dir, capsys):
    steps = rolled_out / "round=0" / "steps.parquet"
    adv, view, ckpt = tmp_path / "adv.parquet", tmp_path / "view.parquet", tmp_path / "ckpt"
    # AT-GRPO's mixed reward (the is preset, alpha 1) is not each row's own correctness: the rs view refuses it
    assert main(["advantages", "--steps", str(steps), "--out", str(adv), "--group-by", "agent_id", "turn", "--loss", "is"]) == 0
    assert main(["view", "--advantages", str(adv), "--out", str(view), "--loss", "rs", "--model-dir", str(default_model_dir)]) == 2
    assert "--alpha 0" in capsys.readouterr().err and not view.exists()
    # the advantages stage takes its own settings: a reward mix the default loss cannot train on is not its rule to refuse
    assert main(["advantages", "--steps", str(steps), "--out", str(adv), "--alpha", "1"]) == 0
    assert "reward = 1.0*global" in capsys.readouterr().out
    # the defaults of advantages and view are maxit run's (the rs loss and its reward preset, alpha 0)
    assert main(["advantages", "--steps", str(steps), "--out", str(adv), "--group-by", "agent_id", "turn"]) == 0
    assert "reward = 0.0*global + 1.0*local" in capsys.readouterr().out
    validate(pl.read_parquet(adv), ADVANTAGES)
    assert main(["view", "--advantages", str(adv), "--out", str(view), "--model-dir", str(default_model_dir)]) == 0
    v = validate(pl.read_parquet(view), TRAINING_VIEW)
    assert v.height > 0 and v["reward"].min() >= 1.0
    assert v["context_swapped"].any()  # prompt_aug / feedback rows train under another context
    assert "training rows of" in capsys.readouterr().out
    rc = main(["train", "--view", str(view), "--policy", "shared", "--init", str(default_model_dir), "--out", str(ckpt), "--loss", "rs", "--epochs", "1", "--report-to", "none",
               "--store", str(tmp_path / "reg"), "--round", "0"])
    assert rc == 0
    meta = read_checkpoint_meta(ckpt)
    assert meta.policy_id == "shared" and meta.n_rows == v.height and meta.parent == str(default_model_dir) and meta.round == 0
    assert (ckpt / "config.json").is_file()
    rec = PolicyRegistry(tmp_path / "reg").get(0, "shared")
    assert rec is not None and Path(rec.path) == ckpt.resolve() and rec.data_hash == meta.data_hash


def test_train_with_a_policy_the_view_lacks_is_an_error_and_writes_nothing(rolled_out, tmp_path, default_model_dir, capsys):
    adv, view, ckpt = tmp_path / "adv.parquet", tmp_path / "view.parquet", tmp_path / "ckpt"
    assert main(["advantages", "--steps", str(rolled_out / "round=0" / "steps.parquet"), "--out", str(adv)]) == 0
    assert main(["view", "--advantages", str(adv), "--out", str(view), "--model-dir", str(default_model_dir)]) == 0
    capsys.readouterr()
    rc = main(["train", "--view", str(view), "--policy", "solvr", "--init", str(default_model_dir), "--out", str(ckpt), "--report-to", "none"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--policy 'solvr'" in err and "['shared']" in err
    # a table that is not an advantages table: the missing columns are named, nothing is written
    pl.read_parquet(adv).drop("advantage", "sample_weight").write_parquet(tmp_path / "steps-only.parquet")
    assert main(["view", "--advantages", str(tmp_path / "steps-only.parquet"), "--out", str(tmp_path / "never.parquet"), "--model-dir", str(default_model_dir)]) == 2
    err = capsys.readouterr().err
    assert "missing column 'advantage'" in err and "missing column 'sample_weight'" in err
    assert not (tmp_path / "never.parquet").exists()
    (tmp_path / "steps-only.parquet").unlink()
    # the rows were sampled at T=1: training them at another temperature would skew every ratio
    assert pl.read_parquet(view)["temperature"].unique().to_list() == [1.0]
    rc = main(["train", "--view", str(view), "--policy", "shared", "--temperature", "0.7", "--init", str(default_model_dir), "--out", str(ckpt), "--report-to", "none"])
    assert rc == 2
    assert "sampled at temperature 1.0 (column 'temperature') but training runs at 0.7" in capsys.readouterr().err
    assert not ckpt.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["adv.parquet", "view.parquet"]
    # without --temperature, training takes the view's own sampling temperature
    pl.read_parquet(view).with_columns(pl.lit(0.7).alias("temperature")).write_parquet(view)
    rc = main(["train", "--view", str(view), "--policy", "shared", "--init", str(default_model_dir), "--out", str(ckpt), "--epochs", "1", "--report-to", "none"])
    assert rc == 0 and read_checkpoint_meta(ckpt).config["temperature"] == 0.7


def test_advantages_demo_and_bad_input(tmp_path, capsys):
    out = tmp_path / "adv.parquet"
    assert main(["advantages", "--demo", "--demo-problems", "20", "--out", str(out)]) == 0
    assert "per agent and strategy" in capsys.readouterr().out
    validate(pl.read_parquet(out), ADVANTAGES)

    # a steps table without `uid` and with a NaN reward: exit 2, the column named, nothing written
    bad = pl.read_parquet(out).drop("uid")
    bad.write_parquet(tmp_path / "bad.parquet")
    target = tmp_path / "never.parquet"
    assert main(["advantages", "--steps", str(tmp_path / "bad.parquet"), "--out", str(target)]) == 2
    assert "'uid'" in capsys.readouterr().err
    nan = pl.read_parquet(out).with_columns(pl.when(pl.col("step_id") == pl.col("step_id").first()).then(float("nan")).otherwise(pl.col("global_reward")).alias("global_reward"))
    nan.write_parquet(tmp_path / "nan.parquet")
    assert main(["advantages", "--steps", str(tmp_path / "nan.parquet"), "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert "NaN or infinite global_reward" in err and repr(nan["step_id"][0]) in err
    assert main(["advantages", "--steps", str(tmp_path / "missing.parquet"), "--out", str(target)]) == 2
    assert "--steps: no such file" in capsys.readouterr().err
    assert main(["advantages", "--demo", "--out", str(target), "--group-by", "agent"]) == 2
    assert "group_by: unknown column(s) ['agent']" in capsys.readouterr().err
    assert not target.exists() and not list(tmp_path.glob(".*tmp*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adv.parquet", "bad.parquet", "nan.parquet"]


def test_a_task_smaller_than_the_flags_ask_is_said_before_the_run(tmp_path):
    """A 20-row task file with --problems 100 and the default --eval-problems: `maxit run`
    says how many problems each split really has, instead of quietly using fewer."""
    import json

    from maxit.cli import small_splits
    from pipeline.run.context import build_workflow
    from pipeline.run.settings import Settings

    task = tmp_path / "small.jsonl"
    task.write_text("".join(json.dumps({"question": f"What is {i}+{i + 3}?", "answer": str(2 * i + 3)}) + "\n" for i in range(20)))
    settings = Settings(task_file=str(task), problems=100)
    workflow = build_workflow(settings.run_config())
    train, heldout = (len(workflow.problems(s, 1000, 0)) for s in ("train", "heldout"))
    assert train + heldout == 20 and train < 100 and heldout < settings.eval_problems
    assert small_splits(settings.run_config(), workflow) == [
        f"maxit run: note: --problems 100, but the task's train split holds {train} problems: each round draws from all {train}",
        f"maxit run: note: --eval-problems {settings.eval_problems}, but the task's heldout split holds {heldout} problems: every evaluation uses {heldout}",
    ]
    assert small_splits(Settings(task_file=str(task), problems=train, eval_problems=heldout).run_config(), workflow) == []


def test_a_bad_flag_is_one_line_naming_it(capsys):
    """argparse's errors come in one line naming the flag and pointing at --help, without the
    forty lines of `maxit run`'s usage before them; exit 2."""
    for argv, said in ((["run", "--loss", "nope"], "maxit run: error: argument --loss: invalid choice: 'nope'"),
                       (["run", "--problems", "x"], "maxit run: error: argument --problems: invalid int value: 'x'"),
                       (["run", "--nope", "1"], "maxit run: error: unrecognized arguments: --nope 1"),
                       (["--nope", "run"], "maxit: error: unrecognized arguments: --nope"),
                       (["sandbox", "run", "p.py", "--nope"], "maxit sandbox run: error: unrecognized arguments: --nope"),
                       (["bogus"], "maxit: error: argument command: invalid choice: 'bogus'")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith(said) and "usage:" not in err, err
        assert err.rstrip().endswith("--help` lists the commands)" if argv[0] in ("bogus", "--nope") else "--help` lists the flags)")


def test_a_flag_has_one_name_across_commands_and_its_old_spelling_still_works(capsys):
    """`maxit view` took `--strategy-weight` and `maxit train` `--processes` where `maxit run` takes
    `--strategy-weights` and `--train-processes`: every command now lists the run's name, and the
    old spelling is taken the same way without being listed, so that scripts keep working."""
    from maxit.cli import build_parser

    parser = build_parser()
    view = ["view", "--advantages", "a.parquet", "--out", "v.parquet"]
    new = parser.parse_args([*view, "--strategy-weights", "iid=1", "tree=2"])
    old = parser.parse_args([*view, "--strategy-weight", "iid=1", "--strategy-weight", "tree=2"])
    assert new.strategy_weights == old.strategy_weights == ["iid=1", "tree=2"]
    train = ["train", "--view", "v.parquet", "--policy", "shared", "--out", "ckpt"]
    assert parser.parse_args([*train, "--train-processes", "2"]).train_processes == parser.parse_args([*train, "--processes", "2"]).train_processes == 2
    for command, listed, hidden in (("view", "--strategy-weights", "--strategy-weight "), ("train", "--train-processes", "--processes"),
                                    ("run", "--strategy-weights", "--strategy-weight ")):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        out = capsys.readouterr().out
        assert listed in out and hidden not in out.replace("--train-processes", ""), command
