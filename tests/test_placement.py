"""Device placement with one trainer lane for the run (issue 57, item 4), checked on a CPU by what
each process is given, and the cost model's terms for what a persistent trainer and engines
refreshed in place save."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import cost_model as cm  # noqa: E402


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two cores to give the trainer one")
def test_the_one_lane_process_is_given_the_trainers_devices_and_cores_and_the_run_the_engines(tmp_path, monkeypatch):
    """`--engine-devices 0 --trainer-devices 1 --trainer-cores C`: the run's process sees device 0
    while it samples; the lane's process, started for the run's first round, is given device 1,
    core C alone and one OpenMP thread, whatever the run's process sees when it starts it."""
    from assets.placement import engine_devices
    from assets import trainer_lane as lane_mod
    from assets.config import RunSettings
    from pipeline.config.scale import DEVICES_ENV
    from pipeline.run.settings import Settings
    from pipeline.store import Tables

    core = max(os.sched_getaffinity(0))
    settings = RunSettings.from_settings(Settings(max_staleness=1, engine_devices="0", trainer_devices="1", trainer_cores=str(core)))
    monkeypatch.setenv(DEVICES_ENV, "7")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with engine_devices(settings.engine_devices):
        assert os.environ[DEVICES_ENV] == "0"
        lane = lane_mod.trainer_lane(Tables(tmp_path / "store"), settings.run_config().scale, "hf")
        try:
            pid = lane.start()
            given = _environ(pid)
            assert given[DEVICES_ENV] == "1" and given["OMP_NUM_THREADS"] == "1"
            assert os.sched_getaffinity(pid) == {core}
            assert os.environ[DEVICES_ENV] == "0" and os.sched_getaffinity(0) != {core}
        finally:
            assert lane_mod.close_lanes() == {str(tmp_path / "store"): 0}
    assert lane.proc is None


def test_where_ranks_hold_the_model_each_round_is_a_process_of_its_own_and_the_log_says_so(tmp_path, caplog):
    from assets import trainer_lane as lane_mod
    from assets.config import RunSettings
    from pipeline.run.settings import Settings
    from pipeline.store import Tables

    settings = RunSettings.from_settings(Settings(max_staleness=1, train_processes=2))
    calls = []
    with caplog.at_level(logging.INFO, logger="assets.trainer_lane"):
        lane_mod.materialize_in_lane(Tables(tmp_path / "store"), 3, settings, "hf", ("policy",), per_round=lambda *a: calls.append(a))
    assert [c[1] for c in calls] == [3] and not lane_mod._LANES
    assert "a process per round (--train-processes 2: the model lives in torchrun's ranks" in caplog.text


def test_a_persistent_trainer_and_refreshed_engines_save_their_starts_per_overlapped_round():
    """Per overlapped round, a trainer process per round pays its start, and the engines one build
    per swap; one trainer for the run and refreshes pay neither,
    so the round is shorter by exactly that where either lane is the slower one."""
    hw = cm.for_model(cm.HARDWARE["h100"], 7e9)
    budget = cm.BUDGETS["gsm8k"]
    st = cm.startup_for(hw)
    trainer_s, sampler_s = cm.lane_startup(7e9, hw, budget, persistent=False)
    assert trainer_s == st.trainer_process
    assert sampler_s == pytest.approx(cm.SWAPS_PER_ROUND * budget.policies * st.engine_build)
    assert cm.lane_startup(7e9, hw, budget, persistent=True) == (0.0, 0.0)
    today, kept, stages = (cm.overlapped_round(7e9, 8, hw, budget, persistent=p) for p in (False, True, None))
    assert (kept.sampler, kept.trainer) == (stages.sampler, stages.trainer)
    assert today.total - kept.total >= min(trainer_s, sampler_s) > 0
    assert cm.startup_for(cm.HARDWARE["cpu"]) is cm.STARTUP["cpu"] and st is cm.STARTUP["gpu"]


def test_the_command_line_states_the_prediction_for_a_gpu_node():
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cost_model.py"), "--params", "7B", "--gpu", "h100", "--gpus", "8",
                           "--budget", "gsm8k", "--overlap", "--sweep", "8"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a trainer lane process per round:" in done.stdout and "refreshed in place: 0" in done.stdout
    assert "8 gpus: round" in done.stdout and "with one trainer and refreshes" in done.stdout
