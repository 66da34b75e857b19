"""PolicyRegistry: base model as round -1, round r reads round r-1, entries are atomic files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import DataError
from pipeline.store.registry import BASE_ROUND, PolicyRegistry

ROOT = Path(__file__).resolve().parents[1]


def ckpt(tmp_path, name):
    p = tmp_path / "checkpoints" / name
    p.mkdir(parents=True)
    return p


def test_rounds_chain_from_the_base(tmp_path):
    reg = PolicyRegistry(tmp_path)
    base = ckpt(tmp_path, "base")
    assert reg.latest("shared", before_round=0) is None
    rec = reg.base("shared", base)
    assert rec.round == BASE_ROUND and rec.parent is None
    assert reg.latest("shared", before_round=0) == base.resolve()
    r0 = ckpt(tmp_path, "r0")
    reg.register(0, "shared", r0, parent=base, data_hash="abc", metrics={"mean_loss": 0.5})
    assert reg.latest("shared", before_round=1) == r0.resolve()
    assert reg.latest("shared", before_round=0) == base.resolve()  # re-running round 0 starts from the base
    got = reg.get(0, "shared")
    assert (got.parent, got.data_hash, got.metrics) == (str(base.resolve()), "abc", {"mean_loss": 0.5})
    assert [r.round for r in reg.records("shared")] == [-1, 0]


def test_policies_are_separate_and_reregistering_replaces(tmp_path):
    reg = PolicyRegistry(tmp_path)
    reg.base("solver", ckpt(tmp_path, "s"))
    reg.base("verifier", ckpt(tmp_path, "v"))
    reg.register(0, "solver", ckpt(tmp_path, "s0"))
    assert reg.latest("verifier", before_round=1).name == "v"
    assert reg.latest("solver", before_round=1).name == "s0"
    reg.register(0, "solver", ckpt(tmp_path, "s0b"))
    assert reg.latest("solver", before_round=1).name == "s0b"
    assert len(reg.records()) == 3
    # a fresh registry object over the same store sees the same entries
    assert PolicyRegistry(tmp_path).latest("solver", before_round=5).name == "s0b"


def test_missing_folders_and_bad_entries_are_errors(tmp_path):
    reg = PolicyRegistry(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        reg.register(0, "shared", tmp_path / "nowhere")
    gone = ckpt(tmp_path, "gone")
    reg.register(0, "shared", gone)
    gone.rmdir()
    with pytest.raises(FileNotFoundError, match="round 0 is missing"):
        reg.latest("shared", before_round=1)
    with pytest.raises(ValueError, match="policy_id"):
        reg.register(1, "../x", ckpt(tmp_path, "x"))
    entry = tmp_path / "checkpoints" / "registry" / "round=2" / "shared.json"
    entry.parent.mkdir(parents=True)
    entry.write_text("{not json")
    with pytest.raises(DataError, match="unreadable"):
        reg.get(2, "shared")
    assert not list((tmp_path / "checkpoints" / "registry").rglob(".*tmp-*"))


REGISTER = "import sys; from pipeline.store.registry import PolicyRegistry; PolicyRegistry(sys.argv[1]).register(int(sys.argv[2]), sys.argv[3], sys.argv[4])"


def test_parallel_registrations_of_one_round_all_survive(tmp_path):
    # six processes at once (fresh interpreters: a worker pool that loses a worker hangs instead of failing)
    jobs = [(str(tmp_path), "3", f"p{i}", str(ckpt(tmp_path, f"p{i}"))) for i in range(6)]
    procs = [subprocess.Popen([sys.executable, "-c", REGISTER, *job], cwd=ROOT, stderr=subprocess.PIPE, text=True) for job in jobs]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    reg = PolicyRegistry(tmp_path)
    assert sorted(r.policy_id for r in reg.records() if r.round == 3) == [f"p{i}" for i in range(6)]
    body = json.loads((tmp_path / "checkpoints" / "registry" / "round=3" / "p0.json").read_text())
    assert body["path"].endswith("p0")
