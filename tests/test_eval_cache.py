"""The starting model's evaluation (round -1) computed once and reused (pipeline/run/eval_cache.py):
a second store with the same model, task and evaluation takes the rows without sampling; any
change to what the rows depend on computes afresh; the flag turns it off; a damaged entry is
recomputed."""

from __future__ import annotations

import shutil

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline.run import eval_cache
from pipeline.store import table_path
from test_settings import _context


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "evaluations"


def _base(tmp_path, name, model_dir, **settings):
    from pipeline.run.rounds import evaluate_base
    from pipeline.store import BASE_ROUND

    ctx, sampler = _context(tmp_path / name, model_dir, **settings)
    frame = evaluate_base(ctx)
    assert_frame_equal(pl.read_parquet(table_path(ctx.store, BASE_ROUND, "evaluation")), frame)
    timings = pl.read_parquet(table_path(ctx.store, BASE_ROUND, "timings"))
    assert "evaluation" in timings["stage"].to_list()
    return frame, sampler, ctx


def test_a_second_run_reuses_the_starting_models_evaluation(tmp_path, tiny_model_dir, cache):
    first, sampler, ctx = _base(tmp_path, "a", tiny_model_dir)
    assert sampler.budgets, "the first run samples its round -1"
    assert len(list(cache.glob("*.parquet"))) == 1
    again, sampler, _ = _base(tmp_path, "b", tiny_model_dir)
    assert not sampler.budgets, "the second run takes round -1 from the cache"
    assert_frame_equal(again, first)
    # the run's own settings that round -1 never sees (seed, learning rate, loss) keep the key
    _, sampler, _ = _base(tmp_path, "c", tiny_model_dir, seed=3, lr=1e-3, loss="ppo")
    assert not sampler.budgets
    # a copy of the model with the same bytes is the same model
    copy = tmp_path / "model-copy"
    shutil.copytree(tiny_model_dir, copy)
    _, sampler, _ = _base(tmp_path, "d", copy)
    assert not sampler.budgets


@pytest.mark.parametrize(
    "change", [{"eval_problems": 3}, {"eval_samples": 2}, {"eval_max_tokens": 5}, {"temperature": 0.7}, {"task_file": "tests/data/gsm8k/train_sample.jsonl"}, "model bytes"]
)
def test_what_the_rows_depend_on_is_in_the_key(tmp_path, tiny_model_dir, cache, change):
    _base(tmp_path, "a", tiny_model_dir)
    model_dir, settings = tiny_model_dir, {}
    if change == "model bytes":
        model_dir = tmp_path / "model-changed"
        shutil.copytree(tiny_model_dir, model_dir)
        (model_dir / "generation_config.json").write_text('{"changed": true}')
    else:
        settings = change
    _, sampler, _ = _base(tmp_path, "b", model_dir, **settings)
    assert sampler.budgets, f"{change}: computed afresh"
    assert len(list(cache.glob("*.parquet"))) == 2


def test_the_flag_computes_afresh_and_leaves_the_cache_alone(tmp_path, tiny_model_dir, cache):
    from maxit.cli import build_parser
    from pipeline.run.settings import settings_from_args

    assert settings_from_args(build_parser().parse_args(["run", "--no-base-eval-cache"])).run_config().evaluation.reuse_base is False
    assert settings_from_args(build_parser().parse_args(["run"])).run_config().evaluation.reuse_base is True
    _base(tmp_path, "a", tiny_model_dir)
    entry = next(cache.glob("*.parquet"))
    stamp = entry.stat().st_mtime_ns
    _, sampler, _ = _base(tmp_path, "b", tiny_model_dir, base_eval_cache=False)
    assert sampler.budgets and entry.stat().st_mtime_ns == stamp and len(list(cache.glob("*.parquet"))) == 1


def test_a_damaged_entry_is_evaluated_afresh_and_replaced(tmp_path, tiny_model_dir, cache, caplog):
    first, _, _ = _base(tmp_path, "a", tiny_model_dir)
    entry = next(cache.glob("*.parquet"))
    entry.write_bytes(b"not parquet")
    again, sampler, _ = _base(tmp_path, "b", tiny_model_dir)
    assert sampler.budgets and "does not read" in caplog.text and str(entry) in caplog.text
    assert_frame_equal(again, first)
    assert_frame_equal(pl.read_parquet(entry), first)


def test_a_cache_that_cannot_be_written_does_not_stop_the_run(tmp_path, tiny_model_dir, monkeypatch, caplog):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("MAXIT_CACHE_DIR", str(blocked))
    first, sampler, ctx = _base(tmp_path, "a", tiny_model_dir)
    assert sampler.budgets and "not kept in the cache" in caplog.text


def test_the_code_digest_hashes_maxits_own_source_and_follows_a_change(tmp_path, monkeypatch):
    import hashlib

    eval_cache.code_digest.cache_clear()
    try:
        assert (eval_cache.ROOT / "pipeline" / "run" / "eval_cache.py").is_file()
        assert eval_cache.code_digest() != hashlib.sha256().hexdigest()  # not a digest of no files
        for package in ("pipeline", "schemas"):
            (tmp_path / package).mkdir()
            (tmp_path / package / "mod.py").write_text("X = 1\n")
        monkeypatch.setattr(eval_cache, "ROOT", tmp_path)
        eval_cache.code_digest.cache_clear()
        before = eval_cache.code_digest()
        (tmp_path / "pipeline" / "mod.py").write_text("X = 2\n")
        eval_cache.code_digest.cache_clear()
        assert eval_cache.code_digest() != before
    finally:
        eval_cache.code_digest.cache_clear()
