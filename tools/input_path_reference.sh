#!/usr/bin/env bash
# The input_path reference on a CUDA host: one direct sweep per preset, one after the other on
# one GPU, each its own run folder (a preset that runs out of time loses only itself).
#   bash tools/input_path_reference.sh OUT [PRESETS] [SECONDS_PER_PRESET]
set -uo pipefail
out=${1:?OUT}; presets=${2:-qwen2.5-vl-7b,qwen3-vl-8b,glm-4.1v-9b,qwen2-vl-7b,tiny-qwen3.5}; each=${3:-150}
export PYTHONUNBUFFERED=1
for preset in $(echo "$presets" | tr , ' '); do
  start=$(date +%s)
  timeout "$each" python3 -m workbench sweep --direct --profile gpu --studies input_path \
    --set "presets=[\"$preset\"]" --set 'mixes=["photos","phone_photos"]' --set n_items=4 --set reps=3 \
    --set sim_requests=50000 ${SETS:-} --results "$out" --name "h200-input-path-$preset" > "$out/$preset.log" 2>&1
  echo "$preset: rc $? in $(( $(date +%s) - start )) s"; tail -n 2 "$out/$preset.log"
done
