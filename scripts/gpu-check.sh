#!/usr/bin/env bash
# GPU check of the GPU backend, for a machine with an NVIDIA GPU (CUDA 13
# driver) or, with SHARDGRAPH_GPU=hip, an AMD GPU (ROCm 5.2 or newer: the
# HIP runtime and hipRTC; RCCL and hipBLAS used when present). Prints a
# summary and exits non-zero on any failure; well under 8 minutes on one
# GPU once built.
#
#   scripts/gpu-check.sh          build and run here (cargo, ./scripts/setup.sh done, and a GPU)
#   scripts/gpu-check.sh pack     build here (no GPU needed) and pack the test, bench and
#                                 example binaries with the ggml oracle into .gpu-check/
#   scripts/gpu-check.sh run      run what `pack` left in .gpu-check/ (a GPU machine without
#                                 Rust: copy .gpu-check/ there and run this from the repository root)
#
# What runs: every kernel compiled by NVRTC for the device and loaded;
# the ggml differential suite on the CUDA backend (cuda_diff); the CUDA
# backend tests (a qwen3 model decoding on 1 and 2 virtual devices equal to
# the CPU run; out of memory, foreign buffers, bad indices); the meta
# backend's regression, store and property tests on 2-3 virtual devices
# (SHARDGRAPH_TEST_DEVICES=cuda); the dflash2 and mtp examples on virtual
# devices with --verify against a CPU run; the benches (matvec GB/s per
# weight type against peak bandwidth, decode tokens/s on 1 and 2 devices).
#
# SHARDGRAPH_GPU=hip (for pack, run or both): the same checks on an AMD GPU
# through the HIP backend (`--features hip`): every kernel compiled by
# hipRTC for the GPU's gfx architecture and loaded, hip_diff, the HIP
# backend tests, the split tests on virtual devices (SHARDGRAPH_TEST_DEVICES=hip)
# and the examples on HIP0 virtual devices with --verify.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
pack=.gpu-check
start=$(date +%s)
vendor="${SHARDGRAPH_GPU:-cuda}"
case "$vendor" in cuda|hip) ;; *) echo "gpu-check: SHARDGRAPH_GPU=$vendor: use cuda or hip"; exit 2 ;; esac

build_and_pack() {
  rm -rf "$pack" && mkdir -p "$pack/bin" "$pack/ggml"
  local json
  if [ "$vendor" = hip ]; then
    json=$( { cargo test --release --features hip --no-run --message-format=json \
                --test ggml_diff --test hip_backend \
                --test split_regressions --test split_store --test split_props;
              cargo build --release --features hip --message-format=json --example dflash2 --example mtp; } )
  else
    json=$( { cargo test --release --features cuda --no-run --message-format=json \
                --test cuda_kernels --test ggml_diff --test cuda_backend \
                --test split_regressions --test split_store --test split_props;
              cargo build --release --features cuda --message-format=json --bench cuda --example dflash2 --example mtp; } )
  fi
  echo "$vendor" > "$pack/vendor"
  echo "$json" | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        name = m["target"]["name"]
        shutil.copy(m["executable"], os.path.join(sys.argv[1], name))
' "$pack/bin"
  strip "$pack"/bin/* 2>/dev/null || true
  cp .venv/lib/python3*/site-packages/ggml/lib/*.so* "$pack/ggml/" 2>/dev/null || echo "gpu-check: no ggml oracle in .venv (run scripts/setup.sh); cuda_diff will be skipped"
  # The oracle's OpenMP runtime, in case the GPU machine's image lacks it.
  for l in $(ldd "$pack"/ggml/libggml-cpu.so 2>/dev/null | awk '/libgomp/ {print $3}'); do cp "$l" "$pack/ggml/"; done
  du -sh "$pack"
}

# The GPU and its libraries: NVIDIA (nvidia-smi; NVRTC and cuBLAS from the
# CUDA toolkit, else a pip wheel) or AMD (rocm-smi/rocminfo; the HIP
# runtime and hipRTC from /opt/rocm/lib or the system's libamdhip64).
find_gpu() {
  if [ "$vendor" = hip ]; then
    if ! (rocm-smi --showproductname 2>/dev/null || rocminfo 2>/dev/null | grep -m3 -E 'Marketing Name|gfx'); then
      echo "gpu-check: no AMD GPU here (rocm-smi and rocminfo fail): nothing to check"
      exit 1
    fi
    [ -d /opt/rocm/lib ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/opt/rocm/lib"
    return
  fi
  if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; then
    echo "gpu-check: no GPU here (nvidia-smi fails): nothing to check"
    exit 1
  fi
  local libs=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | tr ' ' '\n' | sed 's|$|/nvidia/cu13/lib|'); do
    [ -e "$d/libnvrtc.so.13" ] && export SHARDGRAPH_NVRTC_DIR="${SHARDGRAPH_NVRTC_DIR:-$d}"
    ls "$d"/libcublas.so.13 >/dev/null 2>&1 && libs="$libs:$d"
  done
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$libs"
}

run_packed() {
  local bin="$pack/bin"
  [ -d "$bin" ] || { echo "gpu-check: $bin missing (run: scripts/gpu-check.sh pack)"; exit 1; }
  local packed
  packed=$(cat "$pack/vendor" 2>/dev/null || echo cuda)
  [ "$packed" = "$vendor" ] || { echo "gpu-check: $pack holds a $packed build; run with SHARDGRAPH_GPU=$packed or pack again"; exit 1; }
  find_gpu
  # A test that cannot open the GPU fails here instead of skipping or
  # falling back to the emulator.
  export SHARDGRAPH_REQUIRE_GPU=1
  export GGML_LIB_DIR="$PWD/$pack/ggml"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$GGML_LIB_DIR"
  local log="$pack/log.txt" failed=0
  : >"$log"
  step() {  # step <label> <command...>
    local label="$1"; shift
    local t0=$(date +%s)
    if "$@" >>"$log" 2>&1; then echo "gpu-check: ok   $label ($(( $(date +%s) - t0 )) s)"
    else echo "gpu-check: FAIL $label ($(( $(date +%s) - t0 )) s)"; failed=1; fi
  }
  local dev
  if [ "$vendor" = hip ]; then
    dev=HIP0
    step "hipRTC compile + load of every kernel, HIP backend tests" "$bin/hip_backend" --nocapture --test-threads 1
    step "hip_diff (ggml suite on the HIP backend)" "$bin/ggml_diff" hip_diff --nocapture
  else
    dev=CUDA0
    step "NVRTC compile + load of every kernel" "$bin/cuda_kernels" --nocapture --test-threads 1
    step "cuda_diff (ggml suite on the CUDA backend)" "$bin/ggml_diff" cuda_diff --nocapture
    step "CUDA backend tests" "$bin/cuda_backend" --nocapture --test-threads 1
  fi
  step "split regressions on virtual devices" env SHARDGRAPH_TEST_DEVICES="$vendor" "$bin/split_regressions"
  step "split store on virtual devices" env SHARDGRAPH_TEST_DEVICES="$vendor" "$bin/split_store"
  step "split properties on virtual devices" env SHARDGRAPH_TEST_DEVICES="$vendor" "$bin/split_props"
  step "dflash2 example, $dev x2, --verify" "$bin/dflash2" --device "$dev,$dev" --n-predict 48 --verify
  step "dflash2 example, qwen35, $dev x2, --verify" "$bin/dflash2" --target qwen35 --device "$dev,$dev" --n-predict 48 --verify
  step "mtp example, $dev x3, --verify" "$bin/mtp" --device "$dev,$dev,$dev" --n-predict 48 --verify
  # The benches drive CUDA devices only (benches/cuda.rs).
  if [ "$vendor" = cuda ]; then step "benches" env SHARDGRAPH_BENCH_SECS=0.5 "$bin/cuda"; fi
  echo "---- summary lines"
  grep -E "^(cuda_kernels|cuda_diff|hip_backend|hip_diff|qwen3 |verify:|speed-up|plain greedy|dflash2:|mtp:|test result|device:|\| |decode|tokens equal)" "$log" || true
  echo "gpu-check: full log in $log"
  [ "$failed" = 0 ] || { echo "gpu-check: FAILED"; exit 1; }
}

case "$mode" in
  pack) build_and_pack ;;
  run) run_packed ;;
  all) build_and_pack; run_packed ;;
  *) echo "usage: scripts/gpu-check.sh [pack|run]"; exit 2 ;;
esac
echo "gpu-check: done in $(( $(date +%s) - start )) s"
