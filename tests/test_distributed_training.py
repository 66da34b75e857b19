"""Training one policy on several processes (torch.distributed ranks on gloo, started by torchrun):
the checkpoint and the result equal one process's, rank 0 alone writes, and the rows reach the
ranks as one process's micro-batches dealt out in turn."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.config import ViewConfig
from pipeline.config.loss import LossConfig
from pipeline.config.train import TrainConfig
from pipeline.errors import ConfigError, MaxitError
from pipeline.learn.trainer import train_in_subprocess
from pipeline.learn.trainer.process import train_command
from pipeline.learn.trainer.ranks import RankMicroBatches, rank_accumulation
from pipeline.learn.views import build_training_view
from pipeline.models import load_model
from pipeline.models.chat import encode_prompt
from pipeline.strategies import IID
from tiny import advantage_row, advantages_table, tiny_model_dir

T = 0.7


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "base")


def _view(init_dir: Path, n: int, path: Path, seed: int = 0) -> Path:
    """A training view of `n` rows of one policy (4 samples of each prompt, some with advantage
    0), their logprobs the model's own at T, stored at `path`."""
    tok = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32).eval()
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        msgs = [{"role": "system", "content": "Add the numbers."}, {"role": "user", "content": f"{10 + i // 4}+{rng.randint(10, 99)}="}]
        prompt = encode_prompt(tok, msgs)
        completion = [rng.randint(20, 60) for _ in range(rng.randint(2, 7))] + [1]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float() / T
        lp = torch.log_softmax(logits, dim=-1)
        logps = [lp[len(prompt) - 1 + t, c].item() for t, c in enumerate(completion)]
        advantage = 0.0 if i % 5 == 0 else rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5)
        rows.append(advantage_row(
            f"iid-{i}", strategy="iid", sampling_messages=msgs, prompt_ids=prompt, completion_ids=completion, completion_logprobs=logps,
            advantage=advantage, reward=float(advantage > 0), temperature=T, uid=f"p{i // 4}", sample_idx=i % 4,
        ))
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok, ViewConfig(drop_zero_advantage=False))
    pq.write_table(view, path)
    return path


# 22 rows in minibatches of 8 and micro-batches of 2: the last minibatch has 3 micro-batches, so
# the second rank runs a stand-in there; grouped minibatches, length sorting, a shared prefix and
# skipped zero-loss rows are on in the second case; FSDP2 shards the model in the third
CASES = {
    "plain": dict(sort_by_length=False, skip_zero_rows=False),
    "grouped-sorted-prefix-skip": dict(group_minibatches=True, sort_by_length=True, share_prefix=4, skip_zero_rows=True),
    "fsdp": dict(sort_by_length=True, skip_zero_rows=True),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "fsdp" else c for c in CASES])
def test_two_processes_train_the_checkpoint_one_process_trains(init_dir, tmp_path, case):
    """One round's checkpoint from 2 ranks equals 1 process's within float tolerance: the same
    rows in the same order per optimizer step, the token counts summed over the ranks, the
    diagnostics and bookkeeping of the run the same (FSDP2 on gloo too)."""
    view = _view(init_dir, 22, tmp_path / "view.parquet")
    config = TrainConfig(
        report_to="none", temperature=T, minibatch_size=8, micro_batch_size=2, epochs=2, lr=1e-3, loss=LossConfig(kind="ppo"), **CASES[case],
    )
    one = train_in_subprocess(view, "shared", init_dir, tmp_path / "one", config, round_=0)
    fsdp = "full_shard" if case == "fsdp" else "off"
    two = train_in_subprocess(view, "shared", init_dir, tmp_path / "two", config, round_=0, processes=2, fsdp=fsdp)
    assert one.n_rows == two.n_rows == 22
    assert one.steps == two.steps == 6
    assert (two.completion_tokens, two.rows_skipped, two.min_row_visits, two.max_row_visits) == (
        one.completion_tokens, one.rows_skipped, one.min_row_visits, one.max_row_visits,
    )
    assert two.diagnostics.overall.n_rows == one.diagnostics.overall.n_rows > 0
    assert (one.rows_skipped > 0) == CASES[case].get("skip_zero_rows")
    assert two.first_step_diagnostics.overall.n_rows == one.first_step_diagnostics.overall.n_rows
    assert two.diagnostics.overall.mean_log_ratio == pytest.approx(one.diagnostics.overall.mean_log_ratio, abs=1e-5)
    assert two.mean_loss == pytest.approx(one.mean_loss, rel=1e-4, abs=1e-6)
    assert two.padding_fraction == pytest.approx(one.padding_fraction)
    ours, theirs, start = (load_model(p).state_dict() for p in (one.checkpoint, two.checkpoint, init_dir))
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(theirs[k], ours[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert max(float((ours[k] - start[k]).abs().max()) for k in ours) > 1e-3  # it trained


SITECUSTOMIZE = '''
import os, sys
_log = os.path.join(os.environ["WRITES_LOG"], "rank" + os.environ.get("RANK", "none") + ".log")
_watched = os.environ["WRITES_UNDER"]

def _hook(event, args):
    path = None
    if event == "open" and len(args) > 1 and isinstance(args[1], str) and any(m in args[1] for m in "wax+"):
        path = args[0]
    elif event in ("os.rename", "os.replace", "os.mkdir", "shutil.copyfile"):
        path = args[0] if event == "os.mkdir" else args[1]
    if isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path).startswith(_watched):
        with open(_log, "a", encoding="utf-8") as f:  # outside the watched folder: no recursion
            f.write(event + " " + os.fsdecode(path) + "\\n")

sys.addaudithook(_hook)
'''


@pytest.mark.integration
def test_only_rank_0_writes_the_checkpoint_and_the_result(init_dir, tmp_path):
    """`maxit train --processes 2 --store S --round 0`, every file write, rename and folder under
    the run's folder recorded per process by an audit hook: rank 0 writes the checkpoint, the
    launching `maxit` process the registry entry, rank 1 nothing there."""
    import os
    import subprocess
    import sys

    view = _view(init_dir, 12, tmp_path / "view.parquet")
    hooks, logs, work = tmp_path / "hooks", tmp_path / "logs", tmp_path / "work"
    for d in (hooks, logs, work):
        d.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), *sys.path]), "WRITES_LOG": str(logs), "WRITES_UNDER": str(work)}
    maxit = str(Path(sys.executable).with_name("maxit"))
    argv = [maxit, "train", "--view", str(view), "--policy", "shared", "--init", str(init_dir), "--out", str(work / "ckpt"), "--epochs", "1"]
    argv += ["--report-to", "none", "--processes", "2", "--store", str(work / "store"), "--round", "0"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained shared: 12 rows, 1 steps" in done.stdout and "registered as round 0 of policy 'shared'" in done.stdout
    assert sorted(p.name for p in logs.iterdir()) == ["rank0.log", "ranknone.log"]  # rank 1 wrote nothing under work/
    ranked, launcher = ((logs / f"rank{r}.log").read_text(encoding="utf-8") for r in ("0", "none"))
    # the checkpoint's files (safetensors writes from native code, unseen here) and its rename into place
    assert "/config.json" in ranked and "maxit_checkpoint.json" in ranked and f"os.rename {work / 'ckpt'}" in ranked
    assert "/store" not in ranked and "/store" in launcher and "/ckpt/" not in launcher
    assert sorted(p.name for p in work.iterdir()) == ["ckpt", "store"]  # no other folder, no leftover temporary


def test_rank_micro_batches_deal_one_process_micro_batches_in_turn():
    """2 ranks, minibatches of 8 rows in micro-batches of 2 (4 per step): rank r gets micro-batches
    r and r + 2 of each minibatch; the last minibatch (6 rows, 3 micro-batches) leaves rank 1 a
    stand-in (row index + 22); together the ranks run every row once per epoch."""
    order = list(range(21, -1, -1))
    ranks = [list(RankMicroBatches(order, 22, 8, 2, r, 2)) for r in (0, 1)]
    assert rank_accumulation(4, 2) == 2 and len(RankMicroBatches(order, 22, 8, 2, 0, 2)) == 6 == len(ranks[0]) == len(ranks[1])
    assert ranks[0][:2] == [[21, 20], [17, 16]] and ranks[1][:2] == [[19, 18], [15, 14]]
    assert ranks[0][4:] == [[5, 4], [1, 0]] and ranks[1][4:] == [[3, 2], [22 + 5]]
    real = sorted(i for r in ranks for b in r for i in b if i < 22)
    assert real == list(range(22))


def test_bad_process_counts_are_one_line_errors_naming_the_flag():
    with pytest.raises(ConfigError, match=r"^--train-processes must be an integer >= 1, got 0$"):
        train_command("v", "p", "i", "o", "c", "r", processes=0)
    with pytest.raises(ConfigError, match=r"^--fsdp must be one of"):
        train_command("v", "p", "i", "o", "c", "r", processes=2, fsdp="zero3")
    argv = train_command("v", "p", "i", "o", "c", "r", processes=2, port=29999, fsdp="full_shard")
    assert argv[1:4] == ["-m", "torch.distributed.run", "--nnodes"] and "127.0.0.1" in argv and argv[-2:] == ["--fsdp", "full_shard"]


@pytest.mark.integration
def test_a_rank_that_fails_is_named_in_one_line(init_dir, tmp_path):
    view = _view(init_dir, 4, tmp_path / "view.parquet")
    with pytest.raises(MaxitError, match=r"in 2 processes failed: --policy 'nobody': the view .* has no rows of that policy"):
        train_in_subprocess(view, "nobody", init_dir, tmp_path / "o", TrainConfig(report_to="none", temperature=T), processes=2)
    assert not (tmp_path / "o").exists()
