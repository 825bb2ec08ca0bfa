#!/usr/bin/env bash
# FlashAttention-4 on a GPU host without a registry, then a queue of GPU work that survives
# the 10-minute command limit (run from the repo root; tools/fa4_bundle.sh builds the .fa4/ it carries;
# results come back as one archive, $OUT/fa4-out.tgz):
#   bash tools/h200_fa4.sh a        # call 1, carrying .fa4/a: keep the first part of the cu13 libraries
#   bash tools/h200_fa4.sh b        # call 2 (within 30 s), carrying .fa4/b: unpack everything into
#                                   # $SITE, then run the queue until its time is up
#   bash tools/h200_fa4.sh q        # later calls (the machine still warm): go on with the queue
#   bash tools/h200_fa4.sh p        # plain: the queue without FlashAttention-4 (nothing to carry)
# Steps: latency:PRESET:EST, race:PRESET[@MIXES[@ITEMS]]:EST (the GPU profile's gemm="auto"; raceq: gemm="quack", racec:
# gemm="cublas"), breakdown:PRESET@TOKENS:EST, defaults:STUDY@PRESET:EST,
# verify:STUDY@RUN:EST (verify_plain: without FA4), quack:-:EST, cuda_tests:-:EST,
# cuda_part:I/N:EST (the I-th of N interleaved slices of tests/test_cuda.py),
# cuda_k:A,B:EST (the tests of tests/test_cuda.py that `-k "A or B"` selects), backends:-:EST
# (tools/verify_preprocess_backends.py: the torchvision and cuda backends against transformers),
# pytest:FILE@K:EST (another test file, -k K), reduced:STUDY@PRESET:EST (padding_waste or
# input_path with fewer items and repetitions), py:FILE@ARG@ARG:EST (python3 FILE ARG ARG).
# Each step of QUEUE runs once (done markers in /tmp/fa4/done); a step that would not finish in
# the time left waits for the next call, and the steps after it that fit run now.
set -uo pipefail
start=$(date +%s); budget=${BUDGET_S:-575}
# the wheels unpack into a folder named site-packages: quack keys a compiled epilogue by the source of
# every function it reaches, except installed code, which it recognizes by that path segment (elsewhere
# it walks into the CuTe DSL's runtime state and refuses to key it)
SITE=/tmp/fa4/site-packages
mkdir -p /tmp/fa4/done
case "${1:?a|b|q|p}" in
  a) cp .fa4/a/* /tmp/fa4/ && ls -la /tmp/fa4; exit 0 ;;
  b) if [ ! -e $SITE/.complete ]; then
       # part aa comes with call 'a' on this same machine: without it (the machine went back between the calls,
       # or 'a' never started one) nothing is unpacked, so no half-filled folder passes for a whole one later
       [ -e /tmp/fa4/cu13.part.aa ] || { echo "no cu13.part.aa here (a fresh machine): run 'a' and 'b' again"; exit 3; }
       rm -rf $SITE && cp .fa4/b/*.part.* /tmp/fa4/ && mkdir -p $SITE
       cat /tmp/fa4/cu13.part.* | tar xJf - -C $SITE || { echo "the cu13 libraries did not unpack"; rm -rf $SITE; exit 3; }
       for w in .fa4/b/*.whl; do python3 -m zipfile -e "$w" $SITE || { rm -rf $SITE; exit 3; }; done
       touch $SITE/.complete
     fi ;;
esac
export PYTHONPATH=$PWD:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 OMP_NUM_THREADS=16
if [ "$1" = p ]; then export PYTHONPATH=$PWD tag_fa4=plain; else
  # a machine that went cold since the last call starts bare: FlashAttention-4 must be brought again
  [ -e $SITE/.complete ] || { echo "no FlashAttention-4 here (a fresh machine): run 'a' and 'b' again"; exit 3; }
  python3 -c "from flash_attn.cute import flash_attn_varlen_func; import workbench.attention as a, torch; print('fa4:', a.resolve_backend('auto', 'cuda', torch.bfloat16, 72))" || exit 3
fi
# Everything is written under /tmp/fa4/out (it outlives a call while the machine stays warm) and
# packed after each step into $OUT/fa4-out.tgz: one file back, whatever the number of runs and logs
# ($OUT brings back at most 8 files).
out=/tmp/fa4/out; mkdir -p "$out"
# run names say which card ran them (h200, h100, ...: the model in the device name, lower case), since a call for an
# H200 may come back on an H100; 'gpu' where torch cannot name it
gpu=$(python3 -c "import re, torch; m = re.search(r'\b([A-Z]{1,2}\d{2,3})', torch.cuda.get_device_name()); print(m[1].lower() if m else 'gpu')" 2>/dev/null || echo gpu)
# drop the figures (the report redraws them) and keep the sweep's exit status, a timeout's 124 included
keep_rc() { local rc=$?; rm -rf "$out"/runs/*/figures; return $rc; }
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/fa4-out.tgz" -C "$out" . ; }
QUEUE=${QUEUE:-"latency:qwen3-vl-8b:200 latency:glm-4.1v-9b:200 latency:qwen2.5-vl-7b:150 latency:qwen3.5-9b:200 latency:qwen2-vl-7b:150 cuda_tests:-:260"}
for step in $QUEUE; do
  IFS=: read -r kind arg est <<< "$step"
  tag=$kind-${arg//\//_}
  [ -e "/tmp/fa4/done/$tag" ] && continue
  left=$(( budget - ($(date +%s) - start) ))
  # a step that would not fit waits for the next call; a shorter one after it may still run now
  if [ "$left" -lt "$est" ]; then echo "skip $tag for now: ${left}s left, ~${est}s needed"; continue; fi
  t0=$(date +%s)
  case "$kind" in
    latency)  # PRESET: its encoder_latency, realistic cells included, reduced to fit a command
      timeout "$left" python3 -m workbench sweep --direct --profile gpu --studies encoder_latency --results "$out/runs" \
        --set "presets=[\"$arg\"]" --set 'tokens=[256,4096]' --set reps=3 --set warmup=1 --set breakdown=false \
        --name "$gpu-${tag_fa4:-fa4}-$arg" > "$out/latency-$arg.log" 2>&1; keep_rc ;;
    race|raceq|racec)  # PRESET[@MIX,MIX[@ITEMS]]: its realistic cells at the study's repetitions (policy auto's race
      # run out before timing, the fresh-shape streams), one exact cell only; every mix and item count of the study's
      # defaults unless named (a whole default set takes about 15 minutes for qwen3-vl-8b: more than a command);
      # raceq / racec: the same with the SwiGLU MLPs on quack's gated GEMM (gemm="quack") / on cuBLAS (gemm="cublas")
      IFS=@ read -r preset mixes items <<< "$arg"; sets=(); name=race
      [ -n "$mixes" ] && sets+=(--set "mixes=[\"${mixes//,/\",\"}\"]")
      [ -n "$items" ] && sets+=(--set "mix_items=[$items]")
      [ "$kind" = raceq ] && { sets+=(--set 'gemm="quack"'); name=race-quack; }
      [ "$kind" = racec ] && { sets+=(--set 'gemm="cublas"'); name=race-cublas; }
      timeout "$left" python3 -m workbench sweep --direct --profile gpu --studies encoder_latency --results "$out/runs" \
        --set "presets=[\"$preset\"]" --set 'tokens=[256]' --set 'images=[1]' --set breakdown=false "${sets[@]}" \
        --name "$gpu-${tag_fa4:-fa4}-$name-$preset" > "$out/$kind-$arg.log" 2>&1; keep_rc ;;
    quack) timeout "$left" python3 tools/probe_quack.py "$((est - 30))" > "$out/probe_quack.log" 2>&1 ;;
    breakdown)  # one preset's exact cell at $arg merged tokens, eager and graph, kernel time by category
      IFS=@ read -r preset tokens <<< "$arg"
      timeout "$left" python3 -m workbench sweep --direct --profile gpu --studies encoder_latency \
        --results "$out/runs" --set "presets=[\"$preset\"]" --set "tokens=[$tokens]" --set 'images=[1]' \
        --set 'mixes=[]' --set reference=false --set reps=5 --set warmup=1 --name "$gpu-breakdown-$preset" \
        > "$out/breakdown-$preset.log" 2>&1; keep_rc ;;
    verify|verify_plain)  # STUDY@RUN: rerun a committed reference at its parameters, compare its timing-free
      # metrics (verify_plain: without FlashAttention-4 on the path, as the references before it ran)
      IFS=@ read -r study run <<< "$arg"; d="$out/$kind-$study"; mkdir -p "$d"
      path=$PYTHONPATH; [ "$kind" = verify_plain ] && path=$PWD
      timeout "$left" env PYTHONPATH="$path" OUT="$d" python3 tools/verify_reference.py "$study:$run" \
        > "$d.log" 2>&1 ;;
    defaults)  # STUDY@PRESET: one study at the GPU profile's full defaults for one preset
      IFS=@ read -r study preset <<< "$arg"; key=presets; [ "$study" = correctness ] && key=families
      timeout "$left" python3 -m workbench sweep --direct --profile gpu --studies "$study" --results "$out/runs" \
        --set "$key=[\"$preset\"]" --name "$gpu-defaults-$preset" > "$out/defaults-$study-$preset.log" 2>&1; keep_rc ;;
    cuda_tests) timeout "$left" python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider > "$out/cuda_tests.log" 2>&1 ;;
    cuda_part)  # I/N: the I-th of N slices of tests/test_cuda.py's collected tests (a whole run needs >400 s)
      IFS=/ read -r i n <<< "$arg"
      python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider --collect-only 2>/dev/null | grep '::' \
        | awk -v i="$i" -v n="$n" '(NR - 1) % n == i - 1' > "$out/cuda_part-$i.ids"
      timeout "$left" python3 -m pytest -q -p no:cacheprovider $(cat "$out/cuda_part-$i.ids") \
        > "$out/cuda_part-$i.log" 2>&1 ;;
    cuda_k) timeout "$left" python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -k "${arg//,/ or }" \
      > "$out/cuda_k-$arg.log" 2>&1 ;;
    pytest)  # FILE@K: pytest tests/FILE -k K (a test file other than test_cuda.py, on this host)
      IFS=@ read -r file k <<< "$arg"
      timeout "$left" python3 -m pytest "tests/$file" -q -p no:cacheprovider -k "$k" > "$out/pytest-$file.log" 2>&1 ;;
    reduced)  # STUDY@PRESET: padding_waste or input_path cut to fit a command (the README says how)
      IFS=@ read -r study preset <<< "$arg"
      case "$study" in
        padding_waste) sets=(--set n_items=4) ;;
        *) sets=(--set 'mixes=["photos","phone_photos"]' --set n_items=2 --set reps=2 --set sim_requests=50000) ;;
      esac
      timeout "$left" python3 -m workbench sweep --direct --profile gpu --studies "$study" --results "$out/runs" \
        --set "presets=[\"$preset\"]" "${sets[@]}" --name "$gpu-reduced-$preset" > "$out/reduced-$study-$preset.log" 2>&1; keep_rc ;;
    backends) mkdir -p "$out/backends"
      timeout "$left" python3 tools/verify_preprocess_backends.py "$out/backends" > "$out/backends.log" 2>&1 ;;
    py)  # FILE[@ARG@ARG...]: python3 FILE ARG ARG ... (a probe of tools/), its output in py-FILE.log
      IFS=@ read -r -a words <<< "$arg"
      timeout "$left" python3 "${words[@]}" > "$out/py-$(basename "${words[0]}" .py).log" 2>&1 ;;
    *) timeout "$left" bash -c "$arg" ;;
  esac
  rc=$?
  echo "$tag rc=$rc $(( $(date +%s) - t0 ))s"
  [ "$rc" -ne 124 ] && touch "/tmp/fa4/done/$tag"   # a step killed by the time limit runs again next call
  tail -3 "$out"/*"$arg"*.log 2>/dev/null | tail -3
  pack
done
pack
ls /tmp/fa4/done
