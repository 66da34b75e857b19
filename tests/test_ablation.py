"""scripts/ablation.py reuses a finished run only when it ran what the variant asks for now."""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from pipeline.settings import Settings


def _ablation():
    spec = importlib.util.spec_from_file_location("ablation", Path(__file__).resolve().parents[1] / "scripts" / "ablation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _store(tmp_path, settings: Settings) -> Path:
    store = tmp_path / "ppo-seed0"
    store.mkdir()
    values = json.loads(json.dumps(dataclasses.asdict(settings)))
    (store / "experiment.json").write_text(json.dumps({"settings": values}))
    return store


def test_the_record_fills_in_the_preset():
    ab = _ablation()
    ppo = ab.resolved_settings(ab.VARIANTS["ppo"], 0)
    old = ab.resolved_settings(ab.VARIANTS["ppo-2e-4"], 0)
    assert (ppo["lr"], ppo["negative_weight"]) == (5e-4, 0.0) and (old["lr"], old["negative_weight"]) == (2e-4, 0.5)
    assert ppo["seed"] == 0 and ppo["baseline"] == old["baseline"] == "batch"


def test_a_run_left_to_an_old_preset_is_refused_not_reused(tmp_path):
    ab = _ablation()
    # made by the script before it kept records: `--loss ppo`, lr and negatives left to the preset
    store = _store(tmp_path, Settings(loss="ppo", seed=0))
    record = tmp_path / "ppo-seed0.settings.json"
    with pytest.raises(SystemExit, match=r"ppo-seed0: a finished run without a record.*lr.*negative_weight"):
        ab.check_reusable(store, record, ab.resolved_settings(ab.VARIANTS["ppo"], 0))
    assert not record.exists()


def test_a_recorded_run_of_other_settings_is_refused(tmp_path):
    ab = _ablation()
    store = _store(tmp_path, Settings(loss="ppo", seed=0))
    record = tmp_path / "ppo-seed0.settings.json"
    record.write_text(json.dumps(ab.resolved_settings(ab.VARIANTS["ppo-2e-4"], 0)))
    with pytest.raises(SystemExit, match=r"ppo-seed0: a finished run of other settings.*lr: ran 0.0002, asked 0.0005"):
        ab.check_reusable(store, record, ab.resolved_settings(ab.VARIANTS["ppo"], 0))
    ab.check_reusable(store, record, ab.resolved_settings(ab.VARIANTS["ppo-2e-4"], 0))  # the same run: reused


def test_an_unrecorded_run_with_every_preset_setting_given_is_judged_and_recorded(tmp_path):
    ab = _ablation()
    explicit = Settings(loss="ppo", seed=0, alpha=0.0, local_weight=1.0, lr=5e-4, baseline="batch", negative_weight=0.0, clip_high=0.28)
    store = _store(tmp_path, explicit)
    record = tmp_path / "ppo-seed0.settings.json"
    ab.check_reusable(store, record, ab.resolved_settings(ab.VARIANTS["ppo"], 0))
    assert json.loads(record.read_text())["lr"] == 5e-4
    with pytest.raises(SystemExit, match="seed: ran 0, asked 1"):
        ab.check_reusable(store, record, ab.resolved_settings(ab.VARIANTS["ppo"], 1))
