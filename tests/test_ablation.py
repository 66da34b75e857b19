"""scripts/ablation.py reuses a finished run only when it ran what the variant asks for now."""

import importlib.util
import json
from pathlib import Path

import pytest

from pipeline.run.experiment_record import EXPERIMENT_FILE, record_experiment
from pipeline.run.settings import Settings
from pipeline.store import jsonable


def _ablation():
    spec = importlib.util.spec_from_file_location("ablation", Path(__file__).resolve().parents[1] / "scripts" / "ablation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _old_store(tmp_path, settings: Settings) -> Path:
    """A store recorded before experiment.json kept the preset values in effect."""
    store = tmp_path / "ppo-seed0"
    store.mkdir()
    (store / EXPERIMENT_FILE).write_text(json.dumps({"settings": jsonable(settings)}))
    return store


def test_the_record_fills_in_the_preset():
    ab = _ablation()
    ppo = ab.resolved_settings(ab.VARIANTS["ppo"], 0)
    old = ab.resolved_settings(ab.VARIANTS["ppo-2e-4"], 0)
    assert (ppo["lr"], ppo["negative_weight"]) == (5e-4, 0.0) and (old["lr"], old["negative_weight"]) == (2e-4, 0.5)
    assert ppo["seed"] == 0 and ppo["baseline"] == old["baseline"] == "batch"


def test_a_run_left_to_an_old_preset_is_refused_not_reused(tmp_path):
    ab = _ablation()
    # `--loss ppo`, lr and negatives left to the preset, recorded without the values in effect
    store = _old_store(tmp_path, Settings(loss="ppo", seed=0))
    with pytest.raises(SystemExit, match=r"ppo-seed0: a finished run whose experiment.json does not record.*lr.*negative_weight"):
        ab.check_reusable(store, ab.resolved_settings(ab.VARIANTS["ppo"], 0))


def test_a_recorded_run_of_other_settings_is_refused(tmp_path):
    ab = _ablation()
    store = tmp_path / "ppo-seed0"
    record_experiment(store, Settings(loss="ppo", seed=0, lr=2e-4, negative_weight=0.5), "hf")
    with pytest.raises(SystemExit, match=r"ppo-seed0: a finished run of other settings.*lr: ran 0.0002, asked 0.0005"):
        ab.check_reusable(store, ab.resolved_settings(ab.VARIANTS["ppo"], 0))
    ab.check_reusable(store, ab.resolved_settings(ab.VARIANTS["ppo-2e-4"], 0))  # the same run: reused
    record_experiment(store, Settings(loss="ppo", seed=0), "hf")  # the preset, recorded with its values
    ab.check_reusable(store, ab.resolved_settings(ab.VARIANTS["ppo"], 0))


def test_an_unrecorded_run_with_every_preset_setting_given_is_judged_by_its_settings(tmp_path):
    ab = _ablation()
    explicit = Settings(loss="ppo", seed=0, alpha=0.0, local_weight=1.0, lr=5e-4, baseline="batch", negative_weight=0.0, clip_high=0.28)
    store = _old_store(tmp_path, explicit)
    ab.check_reusable(store, ab.resolved_settings(ab.VARIANTS["ppo"], 0))
    with pytest.raises(SystemExit, match="seed: ran 0, asked 1"):
        ab.check_reusable(store, ab.resolved_settings(ab.VARIANTS["ppo"], 1))


def test_a_broken_record_is_named(tmp_path):
    ab = _ablation()
    store = tmp_path / "ppo-seed0"
    store.mkdir()
    (store / EXPERIMENT_FILE).write_text("{not json")
    with pytest.raises(SystemExit, match=r"ppo-seed0/experiment.json: not valid JSON"):
        ab.check_reusable(store, ab.resolved_settings(ab.VARIANTS["ppo"], 0))
