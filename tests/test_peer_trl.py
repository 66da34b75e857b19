"""benchmarks/peer_trl.py: maxit (a team of one) against TRL's GRPOTrainer.

The budget arithmetic is checked directly; the whole --smoke run (maxit run, the TRL worker, the
shared evaluation) runs on a tiny random Llama (tests/tiny.py: byte-level tokenizer with a chat
template, 35K parameters, positions for the file task's worked-example prompts) with the
transformers engine: about two minutes on the 2-core machine (three processes import torch, and
maxit's Dagster and TRL), so it is marked slow (`pytest -m slow tests/test_peer_trl.py`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peer_trl  # noqa: E402


def test_budgets_and_strategies():
    smoke = peer_trl.budget(peer_trl.parse_args(["--smoke"]))
    assert (smoke["rounds"], smoke["problems"], smoke["samples"], smoke["max_tokens"], smoke["eval_problems"]) == (1, 2, 2, 8, 4)
    assert (smoke["minibatch"], smoke["micro"], smoke["eval_max_tokens"]) == (4, 4, 8)  # capped at the 4 samples of a round
    full = peer_trl.budget(peer_trl.parse_args([]))
    assert (full["rounds"], full["problems"], full["samples"], full["max_tokens"], full["minibatch"], full["micro"]) == (3, 16, 4, 64, 8, 8)
    with pytest.raises(SystemExit):
        peer_trl.budget(peer_trl.parse_args(["--problems", "3", "--samples", "3"]))  # 9 samples in minibatches of 8
    assert peer_trl.maxit_strategies(peer_trl.parse_args([])) == ["iid"]
    assert peer_trl.maxit_strategies(peer_trl.parse_args(["--algorithm", "atgrpo"])) is None  # the preset's (tree)
    assert peer_trl.maxit_strategies(peer_trl.parse_args(["--strategies", "preset"])) is None
    mix = peer_trl.parse_args(["--strategies", "mix"])
    assert peer_trl.maxit_strategies(mix) == ["iid", "prompt_aug", "feedback"]
    assert peer_trl.maxit_samples(mix, peer_trl.budget(mix)) == 1  # 1 x (iid + prompt_aug + 2 feedback attempts) = TRL's 4
    assert peer_trl.maxit_samples(peer_trl.parse_args([]), full) == 4
    with pytest.raises(SystemExit, match="--samples must be a multiple of 4, got 6"):
        peer_trl.budget(peer_trl.parse_args(["--strategies", "mix", "--samples", "6", "--problems", "4"]))
    assert full["eval_problems"] == 400  # more than the word file's held-out split: all of it is evaluated


def test_paired_standard_error():
    # 10 problems: 3 turned right, 1 turned wrong, 6 unchanged -> d = (1,1,1,-1,0,...,0), mean 0.2
    before = [False, False, False, True] + [True] * 3 + [False] * 3
    after = [True, True, True, False] + [True] * 3 + [False] * 3
    d = [1, 1, 1, -1] + [0] * 6
    var = sum((x - 0.2) ** 2 for x in d) / 9
    assert peer_trl.paired_se(after, before) == pytest.approx(math.sqrt(var / 10))
    assert peer_trl.paired_se(before, before) == 0.0  # nothing changed: no error on the gain
    # unchanged problems shrink it: the same 4 changes among 100 problems
    assert peer_trl.paired_se(after + [True] * 90, before + [True] * 90) < peer_trl.paired_se(after, before)
    assert math.isnan(peer_trl.paired_se([True], [False]))
    with pytest.raises(ValueError, match="3 answers after, 2 before"):
        peer_trl.paired_se([True] * 3, [True] * 2)


def _tiny_long_model(path: Path) -> Path:
    from tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tok.model_max_length = 4096
    tiny_model(len(tok), max_positions=4096).save_pretrained(path)  # the file task's prompts run to ~1,100 bytes
    tok.save_pretrained(path)
    return path


@pytest.mark.slow
def test_smoke_run_reports_both_systems(tmp_path):
    model = _tiny_long_model(tmp_path / "model")
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "MAXIT_CACHE_DIR": os.environ.get("MAXIT_CACHE_DIR", str(ROOT / ".cache" / "maxit"))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peer_trl.py"), "--smoke", "--model-dir", str(model), "--engine", "hf",
         "--work", str(tmp_path / "work"), "--out", str(out), "--seeds", "0"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("seed 0  maxit:") for ln in lines), proc.stdout
    assert any(ln.startswith("seed 0  TRL  :") for ln in lines), proc.stdout
    assert any(ln.startswith("seed 0  maxit/TRL:") and "TRL prompts identical to maxit's: True" in ln for ln in lines), proc.stdout

    records = [json.loads(ln) for ln in out.read_text().splitlines()]
    settings = [r for r in records if r["kind"] == "settings"]
    assert settings and settings[0]["smoke"] and settings[0]["maxit_strategies"] == ["iid"]
    systems = {r["system"]: r for r in records if r["kind"] == "system"}
    assert set(systems) == {"maxit", "trl"}
    for r in systems.values():
        for key in ("before_greedy", "after_greedy", "gain_greedy", "before_sampled", "after_sampled", "wall_seconds", "seconds_per_sample"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), (r["system"], key, r[key])
        assert r["gain_greedy_se"] >= 0 or math.isnan(r["gain_greedy_se"])
        assert 0 <= r["after_greedy"] <= 1 and r["wall_seconds"] > 0
        assert r["eval_problems"] == 4
        assert r["samples"] == 1 * 2 * 2  # the same sample budget: rounds x problems x samples
    assert systems["maxit"]["before_greedy"] == systems["trl"]["before_greedy"]  # one evaluation of the starting model
    assert systems["trl"]["prompts_identical"] is True
    ratio = next(r for r in records if r["kind"] == "ratio")
    assert math.isfinite(ratio["seconds_per_sample_maxit_over_trl"]) and ratio["seconds_per_sample_maxit_over_trl"] > 0
    assert ratio["gain_maxit_over_trl"] is None or math.isfinite(ratio["gain_maxit_over_trl"])
    assert ratio["gain_maxit_minus_trl"] == pytest.approx(systems["maxit"]["after_greedy"] - systems["trl"]["after_greedy"])


def test_evaluate_names_a_missing_folder_before_loading_anything(tmp_path):
    with pytest.raises(SystemExit, match=f"--evaluate: no such folder: {tmp_path / 'nope'}"):
        peer_trl.main(["--evaluate", str(tmp_path / "nope"), "--work", str(tmp_path / "work")])
    assert not (tmp_path / "work").exists()  # nothing written
