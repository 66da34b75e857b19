"""A trainer that lives across rounds (issue 57, item 4): the model a process saved last round is
reused for the next only when it equals that checkpoint on disk bit for bit, and rounds trained
so give the checkpoints rounds loaded from disk give; the persistent trainer lane (`assets.lane
--serve`) answers round after round, says why a round failed in one line, lives while its run
does and no longer, is not used where torchrun's ranks hold the model, and an overlapped run
gives the same rows and checkpoints with it as with a lane process per round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from assets import trainer_lane as lane_mod
from pipeline.config.loss import LossConfig
from pipeline.config.train import TrainConfig
from pipeline.learn.trainer import resident, train_policy
from pipeline.learn.views import build_training_view
from pipeline.strategies import IID
from test_trainer import FAST, rows_for
from tiny import advantages_table, tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "base")


@pytest.fixture(scope="module")
def views(init_dir):
    tok = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32).eval()
    return [build_training_view(advantages_table(rows_for(tok, model, 8, seed=20 + r)), {"iid": IID()}, tok)[0] for r in range(2)]


@pytest.fixture
def keeping():
    resident.keep_models(True)
    yield
    resident.keep_models(False)


def tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


def rounds(views, init_dir: Path, out: Path, cfg: TrainConfig) -> list[Path]:
    parent, dirs = init_dir, []
    for r, view in enumerate(views):
        parent = train_policy(view, "shared", parent, out / f"r{r}", cfg, round_=r).checkpoint
        dirs.append(parent)
    return dirs


def test_kept_models_train_the_rounds_a_reload_trains_and_a_changed_checkpoint_is_loaded(views, init_dir, tmp_path, keeping):
    cfg = TrainConfig(loss=LossConfig(kind="ppo"), **{**FAST, "lr": 1e-2})
    before = resident.stats()
    kept = rounds(views, init_dir, tmp_path / "kept", cfg)
    after = resident.stats()
    assert after["reused"] - before["reused"] == 1  # round 1 started from what round 0 saved
    resident.keep_models(False)
    loaded = rounds(views, init_dir, tmp_path / "loaded", cfg)
    for a, b in zip(kept, loaded):
        ta, tb = tensors(a), tensors(b)
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert any(not torch.equal(tensors(kept[0])[k], tensors(kept[1])[k]) for k in tensors(kept[0]))  # the rounds moved the weights

    # the checkpoint on disk changed after it was saved (replaced, or written by another run): loaded from disk
    resident.keep_models(True)
    first = train_policy(views[0], "shared", init_dir, tmp_path / "c0", cfg, round_=0).checkpoint
    on_disk = tensors(first)
    name = next(k for k in on_disk if on_disk[k].is_floating_point())
    on_disk[name] = on_disk[name] + 1.0
    save_file(on_disk, str(first / "model.safetensors"), metadata={"format": "pt"})
    mismatched = resident.stats()["mismatched"]
    second = train_policy(views[1], "shared", first, tmp_path / "c1", cfg, round_=1).checkpoint
    assert resident.stats()["mismatched"] == mismatched + 1
    fresh = train_policy(views[1], "shared", first, tmp_path / "c1-fresh", cfg, round_=1).checkpoint  # nothing kept for c0 now
    ta, tb = tensors(second), tensors(fresh)
    assert all(torch.equal(ta[k], tb[k]) for k in ta)


def test_the_kept_model_is_compared_by_name_dtype_and_value(init_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    assert resident.matches_checkpoint(model, init_dir) is None
    assert "dtype" not in (resident.matches_checkpoint(model.to(torch.bfloat16), init_dir) or "")
    assert "bfloat16" in resident.matches_checkpoint(model, init_dir)
    assert resident.matches_checkpoint(model, tmp_path) == "no safetensors files"


def test_lane_holds_the_model_unless_torchruns_ranks_do():
    from pipeline.config.scale import ScaleConfig

    assert lane_mod.holds_model(ScaleConfig()) is None
    assert lane_mod.holds_model(ScaleConfig(shards=2, executor="ray")) is None  # Ray's shards: the round's steps stay in one process
    assert "--train-processes 2" in lane_mod.holds_model(ScaleConfig(train_processes=2))
    assert "sharded by --fsdp full_shard" in lane_mod.holds_model(ScaleConfig(train_processes=2, fsdp="full_shard"))
    assert "--shards 2" in lane_mod.holds_model(ScaleConfig(shards=2))


def test_a_serving_lane_answers_a_bad_request_in_one_line_and_a_crash_fails_the_round(tmp_path):
    """The protocol: a request that is not one is answered with its reason and the lane goes on;
    a round whose process dies of an exception (here a settings file that is not there) fails with its exit
    code, as a per-round process does; end of input ends a lane with 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "assets.lane", "--serve", "--store", str(tmp_path / "store"), "--engine", "hf", "--home", str(tmp_path / "home"),
         "--reply-fd", str(write)],
        cwd=ROOT, stdin=subprocess.PIPE, text=True, pass_fds=(write,), env=env,
    )
    os.close(write)
    with os.fdopen(read, "r") as replies:
        proc.stdin.write("not json\n")
        proc.stdin.flush()
        bad = json.loads(replies.readline())
        proc.stdin.close()
    assert bad["round"] is None and "not one" in bad["error"] and "\n" not in bad["error"]
    assert proc.wait(timeout=60) == 0

    settings = tmp_path / "no-such-settings.json"  # read before anything else: the process ends at once
    lane = lane_mod.TrainerLane(str(tmp_path / "store"), "hf", str(tmp_path / "home"), env, None, ROOT)
    with pytest.raises(lane_mod.MaxitError, match=r"^round 3: policy stopped with exit code 1 \(the trainer lane's process\)$"):
        lane.run(3, ("policy",), settings)
    lane.close()


RUN_SCRIPT = """
import os, sys, threading, time
from pathlib import Path
from pipeline.store.lifeline import run_lifeline
from assets.trainer_lane import TrainerLane
store = Path(sys.argv[1])
with run_lifeline(store):
    lane = TrainerLane(str(store), "hf", str(store / "home"), dict(os.environ), None, Path.cwd())
    # started, and given a round, from a thread that then ends, as the overlapped loop's trainer thread does
    worker = threading.Thread(target=lambda: (lane.start(), lane.proc.stdin.write('{"round": 0, "stages": ["policy"], "settings": "%s"}\\n' % sys.argv[2]), lane.proc.stdin.flush()))
    worker.start()
    worker.join()
    print(lane.proc.pid, flush=True)
    time.sleep(600)
"""


def test_the_lane_process_outlives_the_thread_that_started_it_and_dies_with_the_run(tmp_path):
    """The run (a process here) starts its lane from a thread that ends, and gives it a round that
    blocks (its settings file is a FIFO no one writes): the lane lives on while the run does, and
    dies once the run is killed (kill -9, its own process alone), busy as it is."""
    import signal
    import time

    from pipeline.store.lifeline import alive

    fifo = tmp_path / "settings.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen([sys.executable, "-c", RUN_SCRIPT, str(tmp_path / "store"), str(fifo)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        lane_pid = int(run.stdout.readline())
        time.sleep(3)  # its starting thread has ended; the lane reads the FIFO
        assert alive(lane_pid, None), "the lane died with the thread that started it"
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    deadline = time.monotonic() + 20
    while alive(lane_pid, None) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(lane_pid, None), "the lane outlived its run"


PERSISTENT_RUN = """
import functools, json, sys
import assets.overlapped_run as overlapped_run
from assets import trainer_lane as lane
# the trainer lane of `maxit run` as one process for the run (the call site in
# assets.overlapped_run: `run_overlapped_rounds`' trainer stages through `lane.materialize_in_lane`)
overlapped_run._materialize_in_process_of_its_own = functools.partial(lane.materialize_in_lane, per_round=overlapped_run._materialize_in_process_of_its_own)
from maxit.cli import main
code = main(sys.argv[2:])
lanes = list(lane._LANES.values())
out = {"code": code, "rounds": [l.rounds for l in lanes], "model": [l.model for l in lanes]}
lane.close_lanes()
open(sys.argv[1], "w").write(json.dumps(out))
sys.exit(code)
"""


@pytest.mark.slow  # two runs of three overlapped rounds: minutes on two cores
@pytest.mark.timeout(3000)
def test_an_overlapped_run_gives_the_same_rows_and_checkpoints_with_one_lane_process(tmp_path, default_model_dir):
    """`maxit run --max-staleness 1 --staleness-schedule exact`, three rounds, once with a lane
    process per round and once with one lane process for the run: the same rows in every table of
    every round and the same checkpoint tensors; the one process served rounds 1 and 2 (round 0
    trains from the starting model, which no process kept) from the model it kept."""
    import polars as pl

    from pipeline.store import table_path

    def cmd(store):
        return ["run", "--rounds", "3", "--store", str(store), "--engine", "hf", "--model-dir", str(default_model_dir),
                "--problems", "4", "--samples", "2", "--eval-problems", "4", "--eval-samples", "1", "--epochs", "1",
                "--max-staleness", "1", "--staleness-schedule", "exact"]

    stores = {"per_round": tmp_path / "per_round", "one": tmp_path / "one"}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    done = subprocess.run([sys.executable, "-m", "maxit.cli", *cmd(stores["per_round"])], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1400)
    assert done.returncode == 0, done.stderr[-3000:]
    report = tmp_path / "lane.json"
    done = subprocess.run([sys.executable, "-c", PERSISTENT_RUN, str(report), *cmd(stores["one"])], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1400)
    assert done.returncode == 0, done.stderr[-3000:]
    lanes = json.loads(report.read_text())
    assert lanes["rounds"] == [3] and lanes["model"][0]["reused"] == 2 and lanes["model"][0]["mismatched"] == 0

    for r in range(3):
        for table in ("problems", "steps", "advantages", "training_view", "evaluation"):
            a, b = (pl.read_parquet(table_path(s, r, table)) for s in stores.values())
            key = {"problems": ["uid"], "evaluation": ["policy_id", "agent_id", "split", "metric"]}.get(table, ["step_id"])
            assert a.sort(key).equals(b.sort(key)), (r, table)
        for ckpt in sorted((stores["per_round"] / "checkpoints" / f"round={r}").iterdir()):
            ta, tb = tensors(ckpt), tensors(stores["one"] / "checkpoints" / f"round={r}" / ckpt.name)
            assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), (r, ckpt.name)
