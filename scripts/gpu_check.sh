#!/usr/bin/env bash
# The GPU check: one command, after scripts/setup.sh, under 20 minutes on one H100, no network.
#   bash scripts/gpu_check.sh [OUT]      (OUT: its logs and stores; default runs/gpu-check)
# Parts, each with its own time limit, its log in OUT and its exit in the summary:
#   1. the GPU-marked tests (pytest -m gpu);
#   2. the main job on CUDA, two rounds: vLLM where it imports, else the transformers engine;
#   3. training steps of a randomly initialised ~0.5B Llama-shaped model in bf16: tokens/s and the
#      share of the card's dense bf16 peak (benchmarks/train_step.py);
#   4. `maxit run --rounds 1 --train-processes 2` on the one GPU, where 16 GiB of it are free;
#   5. overlapped rounds with the sampler and the trainer on their own GPUs (`--max-staleness 1
#      --engine-devices 0 --trainer-devices 1`), where the machine has two GPUs or more;
#   6. engines refreshed in place on CUDA (tests/test_engine_refresh.py, its slow test too: a
#      refreshed engine against one built on the new checkpoint), then three overlapped rounds of
#      the main job with one trainer lane process for the run (`assets.lane.materialize_in_lane`),
#      on GPUs of their own where there are two: it prints each round's trainer-lane seconds
#      (round 0 starts the process and loads the model; later rounds reuse the kept model), how
#      often the kept model was reused, and the seconds of each engine build and in-place refresh.
# On a machine without an NVIDIA GPU (nvidia-smi lists none; MAXIT_GPU=0 says the same) it says so,
# skips every part and exits 0. Exit: 0 when every part that ran passed, else 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/lib.sh
out=${1:-runs/gpu-check}
if ! has_nvidia_gpu; then
  echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi lists none): skipped the GPU-marked tests, the main job on CUDA, the bf16 training step of a ~0.5B model and --train-processes 2"
  exit 0
fi
if [ ! -x .venv/bin/maxit ]; then
  echo "gpu_check: .venv/bin/maxit is missing: run bash scripts/setup.sh first (it needs PyPI; this check does not)" >&2
  exit 1
fi
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv | tee "$out/nvidia-smi.csv"
# PyPI's torch 2.13 is a CUDA 13 build: a driver older than the 580 series leaves CUDA unavailable
if ! .venv/bin/python -c 'import sys, torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {torch.cuda.is_available()}"); sys.exit(not torch.cuda.is_available())' | tee "$out/torch.txt"; then
  echo "gpu_check: torch sees no CUDA device (a +cpu torch, or a driver too old for torch's CUDA): nothing else can run" >&2
  exit 1
fi
summary=()
failed=0
# part NAME LIMIT_S COMMAND...: runs it under `timeout`, its output in OUT/NAME.log and on screen
part() {
  local name=$1 limit=$2 t0 rc
  shift 2
  echo "== $name (limit ${limit}s): $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > >(tee "$out/$name.log") 2>&1
  rc=$?
  summary+=("$(printf '%-16s exit %3d  %4ds  %s' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$*")")
  if [ "$rc" -ne 0 ]; then failed=1; fi
}
if .venv/bin/python -c "import vllm" >/dev/null 2>&1; then engine=vllm; else engine=hf; fi
echo "engine for the main job: $engine"
if [ "$engine" = vllm ]; then export MAXIT_REQUIRE_VLLM=1; fi  # its GPU test must run, not skip
part gpu-tests 100 .venv/bin/python -m pytest -q -p no:cacheprovider -m gpu tests
rm -rf "$out/main" "$out/tp2" "$out/overlap-devices" "$out/persistent"
part main-job 160 .venv/bin/maxit run --rounds 2 --engine "$engine" --store "$out/main"
part train-step 60 .venv/bin/python benchmarks/train_step.py --size 0.5b --device cuda --batch 8 --seq 2048 --steps 3
free_gib=$(.venv/bin/python -c 'import torch; print(torch.cuda.mem_get_info()[0] // 2**30)')
if [ "$free_gib" -ge 16 ]; then
  part train-procs-2 100 .venv/bin/maxit run --rounds 1 --train-processes 2 --engine "$engine" --store "$out/tp2"
else
  summary+=("train-procs-2    skipped: ${free_gib} GiB of the GPU free, 16 needed")
fi
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$gpus" -ge 2 ]; then
  part overlap-devices 200 .venv/bin/maxit run --rounds 3 --max-staleness 1 --engine-devices 0 --trainer-devices 1 --engine "$engine" --store "$out/overlap-devices"
else
  summary+=("overlap-devices  skipped: ${gpus} GPU(s), 2 needed (the sampler's and the trainer's)")
fi
part refresh-tests 300 .venv/bin/python -m pytest -q -p no:cacheprovider -m "slow or not slow" tests/test_engine_refresh.py
devices=()
if [ "$gpus" -ge 2 ]; then devices=(--engine-devices 0 --trainer-devices 1); fi
part persistent-lane 300 .venv/bin/python - "$out/persistent" "$engine" ${devices[@]+"${devices[@]}"} <<'EOF'
# maxit run --max-staleness 1 with the trainer lane as one process for the run and the engines
# refreshed in place; what each saved is printed from what it measured
import sys, time
import assets.overlapped_run as launch
from assets import lane
import pipeline.engines.vllm as V
store, engine, devices = sys.argv[1], sys.argv[2], sys.argv[3:]
calls, builds, refreshes = [], [], []
def timed(tables, r, settings, eng, stages, per_round=launch._materialize_in_process_of_its_own):
    t0 = time.perf_counter()
    lane.materialize_in_lane(tables, r, settings, eng, stages, per_round=per_round)
    calls.append((r, time.perf_counter() - t0))
launch._materialize_in_process_of_its_own = timed
build, load = V.VLLMSampler._build, V.VLLMSampler.load_checkpoint
def counted_build(self, d):
    t0 = time.perf_counter(); build(self, d); builds.append(time.perf_counter() - t0)
def counted_load(self, d):
    n, t0 = len(builds), time.perf_counter(); load(self, d)
    if len(builds) == n: refreshes.append(time.perf_counter() - t0)
V.VLLMSampler._build, V.VLLMSampler.load_checkpoint = counted_build, counted_load
from maxit.cli import main
code = main(["run", "--rounds", "3", "--max-staleness", "1", "--engine", engine, "--store", store, *devices])
kept = [l.model for l in lane._LANES.values()]
lane.close_lanes()
print("trainer lane, seconds per round (round 0 starts the process and loads the model):", ", ".join(f"round {r}: {s:.1f}" for r, s in calls))
print("kept model (reused / loaded / differed from disk):", kept)
print(f"engine builds: {len(builds)} ({', '.join(f'{s:.1f}' for s in builds)} s); in-place refreshes: {len(refreshes)} ({', '.join(f'{s:.2f}' for s in refreshes)} s)")
sys.exit(code)
EOF
echo "== summary (logs in $out)"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit "$failed"
