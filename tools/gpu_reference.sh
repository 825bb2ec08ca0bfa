#!/usr/bin/env bash
# Reference measurements on a CUDA host (run from the repo root; used for the H200 runs).
#   bash tools/gpu_reference.sh checks OUT   # CUDA tests + norm bandwidth benchmark
#   bash tools/gpu_reference.sh study OUT    # the studies (GPU profile) through papermill; STUDIES=a,b
#                                            # picks some (default: correctness,cast_cost,fp32_memory)
#   bash tools/gpu_reference.sh gpus OUT     # one sweep on one GPU, then with --gpus over all of them
#                                            # (STUDIES, SET1, SET2 choose the work; see the defaults)
#   bash tools/gpu_reference.sh families OUT # one direct sweep per preset, each on its own GPU, side by
#                                            # side (PRESETS, default qwen3-vl-8b,glm-4.1v-9b; STUDIES,
#                                            # default padding_waste,encoder_latency; SETS: more
#                                            # --set arguments for every sweep, space-separated)
# Needs the offline wheels from `make wheels` in .whl/ for papermill (the GPU image lacks it).
set -uo pipefail
what=${1:?checks|study}; out=${2:-results/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d .whl ] && ! python3 -c "import papermill" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  export JUPYTER_PATH=/tmp/site/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}   # nbconvert's templates
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$out/nvidia-smi.txt"
case "$what" in
  checks)
    python3 -m pytest tests/test_cuda.py -q -s -p no:cacheprovider 2>&1 | tee "$out/cuda_tests.log"
    python3 -m workbench.benchmarks.norm_bandwidth --out "$out/norm_bw.json" 2>&1 | tee "$out/norm_bw.log" ;;
  study)
    python3 -m workbench sweep --profile gpu --studies "${STUDIES:-correctness,cast_cost,fp32_memory}" \
      --results "$out" --name h200 2>&1 \
      | tee "$out/study.log" ;;
  gpus)
    # the same sweep on one GPU, then spread over every GPU of the host (--gpus), for the wall times
    set_args=(--set "${SET1:-encoder_latency.presets=[\"qwen2-vl-7b\",\"qwen2.5-vl-7b\"]}"
              --set "${SET2:-padding_waste.mixes=[\"photos\",\"thumbnails\",\"charts\"]}")
    studies=${STUDIES:-encoder_latency,padding_waste}
    all=$(python3 -c "import torch; print(','.join(map(str, range(torch.cuda.device_count()))))")
    python3 -m workbench sweep --profile gpu --studies "$studies" "${set_args[@]}" --results "$out/one" \
      --name one-gpu 2>&1 | tee "$out/one.log"
    python3 -m workbench sweep --profile gpu --studies "$studies" "${set_args[@]}" --results "$out/all" \
      --name gpus --gpus "$all" 2>&1 | tee "$out/all.log" ;;
  families)
    # one preset per GPU (as many presets as GPUs), direct mode (no papermill needed), 16 threads each
    i=0
    for preset in $(echo "${PRESETS:-qwen3-vl-8b,glm-4.1v-9b}" | tr , ' '); do
      CUDA_VISIBLE_DEVICES=$i OMP_NUM_THREADS=16 python3 -m workbench sweep --direct --profile gpu \
        --studies "${STUDIES:-padding_waste,encoder_latency}" --set "presets=[\"$preset\"]" ${SETS:-} \
        --results "$out" --name "h200-$preset" > "$out/$preset.log" 2>&1 &
      i=$((i + 1))
    done
    wait
    tail -n 3 "$out"/*.log ;;
  *) echo "unknown step $what (checks|study|gpus|families)"; exit 2 ;;
esac
