#!/usr/bin/env bash
# Issue 14's GPU check in one command: the CUDA tests, the conformance suite on CUDA and the GPU
# benchmarks (benchmarks/gpu.py), each step's log, JUnit XML and JSON written under OUT.
#
#   bash scripts/gpu-check.sh --install                      # on a GPU machine: everything
#   bash scripts/gpu-check.sh --install --part tests,decoder # some parts, in the order given
#   bash scripts/gpu-check.sh --reduced                      # here, on the CPU: the plumbing only
#
# Parts: tests (the CUDA test modules), conformance (every plugin's suite on cuda), decoder, conv,
# mlp, fp8, ac, data, tune, ckpt (the benchmarks; ckpt: the stall of a checkpoint, issue 39's
# item 6); `all` is every part in that order. fp8 needs torchao
# (ptrain-fp8-precision's requirement): --install and --wheels install no dependency, so put its
# wheel into the wheelhouse on a machine without the index (pip download --no-deps -d DIR
# torchao==0.18.0).
#
# --install puts the repository's distributions into the Python at hand without touching its torch
# (pip install --no-deps --no-build-isolation -e, one per distribution: the machine's own torch,
# Lightning, pytest and pluggy stay as they are). --wheels DIR installs the wheels of
# scripts/build_dists.sh from DIR instead (for a machine whose setuptools cannot build them).
# --bench-args "..." is passed to every benchmarks/gpu.py step (e.g. "--configs
# 32-true,bf16-mixed+compile"). --step-timeout S stops a step after S seconds (it is recorded as
# failed, exit 124) so that later steps still run. --pack FILE writes the output folder as a
# .tar.gz after every step, so a run stopped from outside still leaves its finished steps in one
# file. --reduced runs every step with tiny models and few steps; the GPU-only tests skip, each
# saying why, and the benchmark runs on the CPU. The suite runs --reduced
# (tests/test_gpu_check.py). Exit status: 0 when every step passed, else 1 (the summary names the
# failed steps); 2 for a bad argument.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-$(command -v python3)}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && py=.venv/bin/python
out=${OUT:-gpu-check-out}
reduced=0 install=0 wheels='' parts=all bench_args='' step_timeout=0 pack=''
PARTS=(tests conformance decoder conv mlp fp8 ac data tune ckpt)
usage() { echo "gpu-check.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --reduced) reduced=1 ;;
    --install) install=1 ;;
    --wheels|--out|--part|--bench-args|--step-timeout|--pack)
      [ $# -ge 2 ] || usage "$1 needs a value"
      case "$1" in
        --wheels) wheels=$2 ;; --out) out=$2 ;; --part) parts=$2 ;;
        --bench-args) bench_args=$2 ;; --step-timeout) step_timeout=$2 ;; --pack) pack=$2 ;;
      esac
      shift ;;
    *) usage "unknown argument '$1' (choices: --reduced, --install, --wheels DIR, --out DIR," \
             "--part PART[,PART...], --bench-args ARGS, --step-timeout S, --pack FILE)" ;;
  esac
  shift
done
[ "$parts" = all ] && parts=$(IFS=,; echo "${PARTS[*]}")
IFS=, read -ra selected <<< "$parts"
for part in "${selected[@]}"; do
  case " ${PARTS[*]} " in *" $part "*) ;; *)
    usage "--part '$part' is not one of ${PARTS[*]}, all" ;;
  esac
done
[[ "$step_timeout" =~ ^[0-9]+$ ]] ||
  usage "--step-timeout '$step_timeout' is not a whole number of seconds"
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/summary.md"
: > "$summary"
failed=0

step() {  # step NAME COMMAND...: run it, log to OUT/NAME.log, record the outcome
  local name=$1; shift
  local started=$SECONDS
  echo "== $name: $*"
  if [ "$step_timeout" -gt 0 ]; then
    timeout --kill-after=10 "$step_timeout" "$@" > "$out/$name.log" 2>&1
  else
    "$@" > "$out/$name.log" 2>&1
  fi
  local rc=$?
  local outcome=passed
  [ $rc -ne 0 ] && outcome="FAILED (exit $rc)" && failed=1
  [ $rc -eq 124 ] && outcome="FAILED (stopped after $step_timeout s)"
  echo "| $name | $outcome | $((SECONDS - started)) s |" | tee -a "$summary"
  tail -n 3 "$out/$name.log"
  [ -z "$pack" ] || tar czf "$pack" -C "$(dirname "$out")" "$(basename "$out")"
}

if [ -n "$wheels" ]; then
  step install "$py" -m pip install -q --no-deps --no-index --force-reinstall "$wheels"/*.whl
elif [ $install = 1 ]; then
  dists=(-e .)
  for project in plugins/*/*/pyproject.toml; do dists+=(-e "$(dirname "$project")"); done
  step install "$py" -m pip install -q --no-deps --no-build-isolation "${dists[@]}"
fi

step environment "$py" -c "
import torch, ptrain
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'ptrain', ptrain.__version__)
print('gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else
      'none: torch.cuda.is_available() is False (the GPU steps skip, saying why)')"

bench=("$py" benchmarks/gpu.py)
[ $reduced = 1 ] && bench+=(--reduced)
read -ra extra <<< "$bench_args"
bench+=("${extra[@]}")
for part in "${selected[@]}"; do
  case $part in
    tests)  # CUDA's own tests (they skip with the reason where torch sees no GPU)
      step cuda-tests "$py" -m pytest -q -p no:cacheprovider -rs --junitxml="$out/cuda-tests.xml" \
        tests/plugins/accelerators/test_cuda_gpu.py tests/plugins/accelerators/test_cuda_paths.py ;;
    conformance)  # every plugin's suite on the GPU (multi-process strategies need 2 GPUs: left out)
      PTRAIN_CONFORMANCE_ACCELERATOR=cuda step conformance-cuda "$py" -m pytest -q \
        -p no:cacheprovider -rs -m "not slow" --junitxml="$out/conformance-cuda.xml" \
        tests/test_conformance.py ;;
    decoder)
      step bench-decoder "${bench[@]}" --sections matrix --workloads decoder --out "$out/decoder" ;;
    conv) step bench-conv "${bench[@]}" --sections matrix --workloads conv --out "$out/conv" ;;
    mlp) step bench-mlp "${bench[@]}" --sections matrix --workloads mlp --out "$out/mlp" ;;
    fp8) step bench-fp8 "${bench[@]}" --sections fp8 --out "$out/fp8" ;;
    ac) step bench-ac "${bench[@]}" --sections ac --out "$out/ac" ;;
    data) step bench-data "${bench[@]}" --sections data --out "$out/data" ;;
    tune)  # ptrain tune on the digits example and the small transformer (issue 17's benchmark)
      if [ $reduced = 1 ]; then
        step bench-tune "$py" benchmarks/tune.py --budget 2m --models digits \
          --tune-args "--tune-only precision --tune-steps 10 --tune-repeats 2"
      else
        step bench-tune "$py" benchmarks/tune.py --accelerator cuda --budget 3m
      fi ;;
    ckpt)  # the stall of a checkpoint, written synchronously and in the background
      mkdir -p "$out/ckpt"
      if [ $reduced = 1 ]; then
        step bench-ckpt "$py" benchmarks/checkpointing.py --quick --no-fsdp --steps 7 --every 3 \
          --workdir "$out/ckpt" --out "$out/ckpt/checkpointing.json"
      else
        step bench-ckpt "$py" benchmarks/checkpointing.py --device cuda --no-fsdp --threads 4 \
          --workdir "$out/ckpt" --out "$out/ckpt/checkpointing.json"
        # fsdp's stall on 2 CPU processes with cores to spare for the writers (on 2 cores the
        # writer has none, and the figure says so rather than what asynchronous saving gains);
        # Adam: a checkpoint three times the bytes the step's collectives move
        step bench-ckpt-fsdp "$py" benchmarks/checkpointing.py --only-fsdp --threads 4 \
          --optimizer adam \
          --workdir "$out/ckpt" --out "$out/ckpt/checkpointing-fsdp.json"
      fi ;;
  esac
done

echo "summary ($summary):"
cat "$summary"
exit $failed
