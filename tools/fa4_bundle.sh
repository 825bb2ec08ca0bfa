#!/usr/bin/env bash
# Build what tools/h200_fa4.sh carries to a GPU host without a registry: FlashAttention-4 and its CuTe
# libraries for the H200 image (CPython 3.12, manylinux x86_64), split to fit two calls' 64 MiB carry
# limit with the checkout's own tree (FACTS.md says why this shape):
#   .fa4/a/cu13.part.aa             the first 40 MiB of the cu13 libraries (unpacked, tar.xz -9)
#   .fa4/b/cu13.part.a[b-]  *.whl   the rest of them, and every other wheel
#   .fa4/versions.txt               what was bundled (meta.json records the versions a run imported)
# Run from the repository root, where pip can reach a package index: `bash tools/fa4_bundle.sh` (about 3 min
# on 2 cores, most of it xz).
# Then: `run` carry [".fa4/a"] `bash tools/h200_fa4.sh a`, and at once carry [".fa4/b"] `bash tools/h200_fa4.sh b`.
set -euo pipefail
PINS=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
      apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64)
PY=${PYTHON:-python3}
[ -d workbench ] && [ -f tools/h200_fa4.sh ] || { echo "fa4_bundle: run it from the repository root" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]/#/--platform=}" -d "$work/whl" "${PINS[@]}" 2>&1 | grep -v "is ignored" || true
for pin in "${PINS[@]}"; do
  name=${pin%%==*}
  ls "$work/whl/${name//-/_}"-* > /dev/null 2>&1 || { echo "fa4_bundle: pip did not fetch $pin" >&2; exit 3; }
done
mkdir -p "$work/cu13"
"$PY" -m zipfile -e "$work"/whl/nvidia_cutlass_dsl_libs_cu13-*.whl "$work/cu13"
rm -rf .fa4 && mkdir -p .fa4/a .fa4/b
tar -cf - -C "$work/cu13" . | xz -9 -T0 | split -b 40M - .fa4/b/cu13.part.
mv .fa4/b/cu13.part.aa .fa4/a/
find "$work/whl" -name '*.whl' ! -name 'nvidia_cutlass_dsl_libs_cu13-*' -exec cp {} .fa4/b/ \;
printf '%s\n' "${PINS[@]}" > .fa4/versions.txt
du -sh .fa4/a .fa4/b
echo "fa4_bundle: .fa4/a and .fa4/b ready (each under 45 MiB; a call carries 64 MiB with the tree)"
