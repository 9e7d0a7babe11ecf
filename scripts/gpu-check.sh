#!/usr/bin/env bash
# GPU check of the GPU backend, for a machine with an NVIDIA GPU (CUDA 13
# driver) or, with SHARDGRAPH_GPU=hip, an AMD GPU (ROCm 5.2 or newer: the
# HIP runtime and hipRTC; RCCL and hipBLAS used when present).
#
#   scripts/gpu-check.sh              pack, then run (a machine with cargo and a GPU)
#   scripts/gpu-check.sh pack         build here (no GPU needed) and pack the test, bench and
#                                     example binaries with the ggml oracle into .gpu-check/;
#                                     prints what a device call carries (must stay under 64 MiB)
#   scripts/gpu-check.sh pack --emu   the same binaries built with the emulator
#                                     (--features cuda-emu,hip), for `run --dry`
#   scripts/gpu-check.sh run          run what `pack` left in .gpu-check/ (a GPU machine without
#                                     Rust: carry .gpu-check/ there, run this from the repository root)
#   scripts/gpu-check.sh run --dry    the same steps on a machine without a GPU, on emulated
#                                     devices (EMU), from `pack --emu`: shows the step order,
#                                     the time limits, $OUT filling and the failure summaries
#   scripts/gpu-check.sh run --echo   prints the steps (time limit, command) and runs nothing
#
# `run` runs the steps below in order of value, each under `timeout`, within
# a budget for the whole run (SHARDGRAPH_GPU_CHECK_BUDGET, default 480 s, so
# one 540-600 s device call holds it with margin: a step gets at most what
# is left; one that no longer fits is skipped). SHARDGRAPH_GPU_CHECK_STEPS=id,id
# runs only those steps (a rerun). Versions come first (nvidia-smi's GPU,
# memory and driver; then the NVRTC the binaries actually loaded, the
# driver's CUDA version, and the kernels loaded on the GPU).
#
# What comes back: everything goes to $OUT (the device tool's folder; else
# .gpu-check/out): log.txt, every step's output (at most 1 MiB each), and
# summary.txt, one line per step (ok, FAIL with its exit status, TIMEOUT,
# SKIP; seconds) with the lines that matter below it (the failing cases'
# `FAIL op(...)` lines, panics and the line after, errors, proptest's
# minimal input; for a passing step its result lines), both rewritten
# after every step; the running step's output is in current.log until it
# ends, so a call killed mid-step still brings back what ran. stdout shows
# the summary as it grows.
#
# Steps (CUDA): versions (the kernels compiled by NVRTC for the GPU and
# loaded, once: later processes read them from the disk cache, see
# src/backend/cuda/nvrtc.rs); kernels (cuda_kernels for sm_90 only);
# backend (cuda_backend: qwen3/qwen35 decoding and speculative decoding on
# 1-2 virtual devices equal to the CPU run; get_rows, cpy, mul_mat and
# mul_mat_id of ggml 0.25.3's IQ*, TQ*, MXFP4, NVFP4, Q1_0, Q2_0 weights
# and IQ4_NL K/V equal to the CPU; out of memory, foreign buffers, bad
# indices); diff (cuda_diff, the ggml differential suite on
# the GPU, cuBLAS on) and diff-own-gemm (its mul_mat cases with
# SHARDGRAPH_CUBLAS=0: our GEMM kernels); main (the dflash2 example on a
# small qwen3 + DFlash2 pair that the bench binary writes, 2 virtual
# devices, --verify against a CPU run); split-regressions, split-store,
# split-props (SHARDGRAPH_TEST_DEVICES=cuda, proptest cases and shrinking
# reduced, 4 test threads); mtp and dflash2-qwen35 (the examples on the
# qwen35 hybrid they write on first use, --verify); bench (matvec GB/s per
# weight type, the IQ/TQ/FP4/Q1_0/Q2_0 types among them, against peak
# bandwidth; decode tokens/s of the small qwen3 on 1 and 2 virtual
# devices). `run` sets SHARDGRAPH_REQUIRE_GPU=1 (a test or the bench that
# cannot open the GPU fails instead of skipping or falling back to the
# emulator), SHARDGRAPH_REQUIRE_GGML=1 (cuda_diff fails without either
# oracle) and SHARDGRAPH_REQUIRE_NVRTC=1 (cuda_kernels fails without
# NVRTC; tests/common/require.rs); --dry leaves REQUIRE_GPU as the
# caller set it (export SHARDGRAPH_REQUIRE_GPU=1 to see failures there).
#
# SHARDGRAPH_GPU=hip (for pack, run or both): the same on an AMD GPU
# through the HIP backend (`--features hip`): hip_backend (hipRTC compile
# and load of every kernel, the backend tests), hip_diff, the split tests
# (SHARDGRAPH_TEST_DEVICES=hip) and the examples on HIP0 virtual devices
# with --verify (no bench; the main job on the example's own model).
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
[ $# -gt 0 ] && shift
pack=.gpu-check
start=$(date +%s)
vendor="${SHARDGRAPH_GPU:-cuda}"
case "$vendor" in cuda|hip) ;; *) echo "gpu-check: SHARDGRAPH_GPU=$vendor: use cuda or hip"; exit 2 ;; esac
# What one device call may carry (the working tree and the carried folder).
carry_limit=$((64 << 20))

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

build_and_pack() {
  local flavour=gpu features
  [ "${1:-}" = "--emu" ] && flavour=emu
  if [ "$flavour" = emu ]; then
    features=cuda-emu,hip
  else
    features="$vendor"
  fi
  rm -rf "$pack" && mkdir -p "$pack/bin" "$pack/ggml" || exit 1
  local json tests=(--test ggml_diff --test split_regressions --test split_store --test split_props)
  local extra=(--example dflash2 --example mtp)
  if [ "$vendor" = hip ]; then
    tests+=(--test hip_backend)
  else
    tests+=(--test cuda_kernels --test cuda_backend)
    extra+=(--bench cuda)
  fi
  echo "gpu-check: building (--release --features $features) ..."
  json=$( { cargo test --release --features "$features" --no-run --message-format=json "${tests[@]}" &&
            cargo build --release --features "$features" --message-format=json "${extra[@]}"; } ) ||
    { echo "gpu-check: build failed"; exit 1; }
  echo "$vendor" > "$pack/vendor"
  echo "$flavour" > "$pack/flavour"
  echo "$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo +changes), --features $features, packed $(date -u +%FT%TZ)" > "$pack/build"
  echo "$json" | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        shutil.copy(m["executable"], os.path.join(sys.argv[1], m["target"]["name"]))
' "$pack/bin" || exit 1
  strip "$pack"/bin/* 2>/dev/null || true
  chmod 755 "$pack"/bin/*
  cp .venv/lib/python3*/site-packages/ggml/lib/*.so* "$pack/ggml/" 2>/dev/null ||
    echo "gpu-check: no ggml oracle in .venv (run scripts/setup.sh); cuda_diff will fail (SHARDGRAPH_REQUIRE_GGML)"
  # The differential suite's second oracle, ggml 0.25.3 (llama-cpp-python's
  # libraries; libggml-cpu.so needs libggml-base.so.0 beside it).
  mkdir -p "$pack/ggml25"
  for l in libggml-base.so libggml-base.so.0 libggml-cpu.so libggml-cpu.so.0; do
    cp -L .venv/lib/python3*/site-packages/llama_cpp/lib/$l "$pack/ggml25/" 2>/dev/null ||
      echo "gpu-check: no ggml 0.25.3 ($l) in .venv (run scripts/setup.sh); cuda_diff will fail (SHARDGRAPH_REQUIRE_GGML)"
  done
  # The oracle's OpenMP runtime, in case the GPU machine's image lacks it.
  for l in $(ldd "$pack"/ggml/libggml-cpu.so 2>/dev/null | awk '/libgomp/ {print $3}'); do cp "$l" "$pack/ggml/"; done
  local packed tree total
  packed=$(du -sb "$pack" | cut -f1)
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  total=$((packed + tree))
  ls -l "$pack/bin" | awk 'NR > 1 {printf "  %-20s %s\n", $NF, $5}'
  echo "gpu-check: packed ($flavour build): $pack $(mib "$packed") + working tree $(mib "$tree") = $(mib "$total") of the $(mib "$carry_limit") a device call carries"
  if [ "$total" -ge "$carry_limit" ]; then
    echo "gpu-check: too large to carry"; exit 1
  fi
  echo "gpu-check: device call: carry [\"$pack\"], command: scripts/gpu-check.sh run, timeout_s 540 to 600 (the run keeps to SHARDGRAPH_GPU_CHECK_BUDGET, default 480 s)"
}

# The GPU and its libraries: NVIDIA (nvidia-smi; NVRTC and cuBLAS from the
# CUDA toolkit, else a pip wheel) or AMD (rocm-smi/rocminfo; the HIP
# runtime and hipRTC from /opt/rocm/lib or the system's libamdhip64).
find_gpu() {
  if [ "$vendor" = hip ]; then
    if ! (rocm-smi --showproductname 2>/dev/null || rocminfo 2>/dev/null | grep -m3 -E 'Marketing Name|gfx'); then
      echo "gpu-check: no AMD GPU here (rocm-smi and rocminfo fail): nothing to check"
      return 1
    fi
    [ -d /opt/rocm/lib ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/opt/rocm/lib"
    return
  fi
  if ! nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null; then
    echo "gpu-check: no GPU here (nvidia-smi fails): nothing to check (run --dry to try the steps on the emulator)"
    return 1
  fi
  local libs="" d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | tr ' ' '\n' | sed 's|$|/nvidia/cu13/lib|'); do
    [ -e "$d/libnvrtc.so.13" ] && export SHARDGRAPH_NVRTC_DIR="${SHARDGRAPH_NVRTC_DIR:-$d}"
    ls "$d"/libcublas.so.13 >/dev/null 2>&1 && libs="$libs:$d"
  done
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$libs"
  echo "NVRTC folder: ${SHARDGRAPH_NVRTC_DIR:-none found, the system loader path}; cuBLAS folders:${libs:- none}"
}

# The lines of a step's output that say what happened: failures (ggml_diff's
# `  FAIL op(...)`, panics and the message line after, errors, proptest's
# minimal input, a failed test's name) or, for `ok`, its result lines.
failure_lines() {
  awk '
    after { print; after = 0; next }
    /panicked at/ { print; after = 1; next }
    /^ +FAIL |^error|[Ee]rror: |^---- .* ----$|minimal failing input|Test failed|CUDA_ERROR|HIP_ERROR|hipError|Segmentation fault|core dumped|Aborted|SHARDGRAPH_REQUIRE/ { print }
  ' "$1" | cut -c1-300 | head -n 14
  grep -E 'test result: FAILED|^(cuda_diff|hip_diff|ggml_diff): .* failures' "$1" | cut -c1-300 | tail -n 2
}
result_lines() {
  grep -E '^(cuda_kernels|cuda_diff|cuda_backend|hip_backend|hip_diff|qwen3 |mtp|dflash2|verify:|speed-up|plain greedy|device:|tokens equal|nvrtc:|wrote |target |decode)|test result:|^\| [A-Z]' "$1" |
    cut -c1-240 | tail -n 14
}

# step <id> <seconds> <label> <command...>: runs the command under `timeout`
# (its limit cut to what is left of the budget), its output in
# $OUT/current.log while it runs, then appended to $OUT/log.txt; one summary
# line (and the lines that matter) into $OUT/summary.txt and stdout.
step() {
  local id="$1" limit="$2" label="$3"; shift 3
  if [ -n "${SHARDGRAPH_GPU_CHECK_STEPS:-}" ] && [[ ",$SHARDGRAPH_GPU_CHECK_STEPS," != *",$id,"* ]]; then
    return
  fi
  local left=$(( budget - ($(date +%s) - start) )) t="$limit"
  [ "$t" -gt $((left - 5)) ] && t=$((left - 5))
  if [ "$echo_only" = 1 ]; then
    printf '%-18s %4d s  %s\n%22s %s\n' "$id" "$limit" "$label" "" "$*" | tee -a "$sum"
    limits=$((limits + limit))
    return
  fi
  if [ "$t" -lt 10 ]; then
    printf 'SKIP    %-18s %s: %d s of the %d s budget left\n' "$id" "$label" "$left" "$budget" | tee -a "$sum"
    skipped=$((skipped + 1)); cp "$sum" "$OUT/summary.txt"
    return
  fi
  local cur="$OUT/current.log" t0 rc dt status
  { echo "==== $id: $label (limit $t s) $(date -u +%T)"; echo "==== $*"; } > "$cur"
  { cat "$sum"; echo "running $id (limit $t s) since $(date -u +%T)"; } > "$OUT/summary.txt"
  t0=$(date +%s)
  # In the background, so a signal to this script reaches `on_signal` at once.
  timeout -k 10 "$t" "$@" >> "$cur" 2>&1 < /dev/null &
  child=$! current="$id"
  wait "$child"
  rc=$?
  child=""
  dt=$(( $(date +%s) - t0 ))
  case "$rc" in
    0) status=ok; passed=$((passed + 1)) ;;
    124|137) status=TIMEOUT; failed=$((failed + 1)) ;;
    *) status=FAIL; failed=$((failed + 1)) ;;
  esac
  echo "==== $id: $status (exit $rc) after $dt s" >> "$cur"
  {
    if [ "$status" = ok ]; then
      printf 'ok      %-18s %s (%d s)\n' "$id" "$label" "$dt"
      result_lines "$cur" | sed 's/^/          /'
    else
      printf '%-7s %-18s %s (exit %d, %d s of %d)\n' "$status" "$id" "$label" "$rc" "$dt" "$t"
      failure_lines "$cur" | sed 's/^/          | /'
      [ "$status" = TIMEOUT ] && tail -n 4 "$cur" | cut -c1-240 | sed 's/^/          (last) /'
      grep -E '^nvrtc:' "$cur" | sed 's/^/          /'
    fi
  } | tee -a "$sum"
  # The step's output into the log, at most 1 MiB (its head and tail).
  if [ "$(stat -c %s "$cur")" -gt $((1 << 20)) ]; then
    { head -c $((256 << 10)) "$cur"; echo; echo "[... cut: $(stat -c %s "$cur") bytes in all ...]"; tail -c $((768 << 10)) "$cur"; } >> "$log"
  else
    cat "$cur" >> "$log"
  fi
  rm -f "$cur"
  cp "$sum" "$OUT/summary.txt"
}

# The script killed (the device call's limit): the running step's process
# (`timeout`, which passes the signal on) ended too, and a last summary line.
on_signal() {
  [ -n "${child:-}" ] && kill -TERM "$child" 2>/dev/null
  echo "KILLED  ${current:-?} (this script was stopped after $(( $(date +%s) - start )) s)" | tee -a "$sum"
  cp "$sum" "$OUT/summary.txt" 2>/dev/null
  exit 143
}

run_packed() {
  local dry=0 a
  child="" current=""
  trap on_signal TERM INT HUP
  echo_only=0
  for a in "$@"; do
    case "$a" in
      --dry) dry=1 ;;
      --echo) echo_only=1 ;;
      *) echo "gpu-check run: unknown option $a (--dry, --echo)"; exit 2 ;;
    esac
  done
  local bin="$pack/bin" flavour packed
  if [ "$echo_only" = 0 ]; then
    [ -d "$bin" ] || { echo "gpu-check: $bin missing (run: scripts/gpu-check.sh pack$([ "$dry" = 1 ] && echo ' --emu'))"; exit 1; }
    packed=$(cat "$pack/vendor" 2>/dev/null || echo cuda)
    [ "$packed" = "$vendor" ] || { echo "gpu-check: $pack holds a $packed build; run with SHARDGRAPH_GPU=$packed or pack again"; exit 1; }
    flavour=$(cat "$pack/flavour" 2>/dev/null || echo gpu)
    if [ "$dry" = 1 ] && [ "$flavour" != emu ]; then
      echo "gpu-check: --dry runs the emulator build: scripts/gpu-check.sh pack --emu"; exit 1
    fi
    # In case the copy to the device machine dropped the execute bits.
    chmod +x "$bin"/* 2>/dev/null || true
  fi
  OUT="${OUT:-$PWD/$pack/out}"
  mkdir -p "$OUT" "$pack"
  log="$OUT/log.txt" sum="$pack/summary.txt"
  : > "$log"; : > "$sum"; rm -f "$OUT/current.log"
  budget="${SHARDGRAPH_GPU_CHECK_BUDGET:-480}"
  passed=0 failed=0 skipped=0 limits=0
  local dev gpu_line=""
  if [ "$dry" = 1 ]; then
    dev=EMU; [ "$vendor" = hip ] && dev=EMUHIP
    gpu_line="dry run: no GPU, emulated devices ($dev); REQUIRE_GPU ${SHARDGRAPH_REQUIRE_GPU:-unset}"
    export SHARDGRAPH_BENCH_EMU=1
  elif [ "$echo_only" = 1 ]; then
    dev=CUDA0; [ "$vendor" = hip ] && dev=HIP0
  else
    # (Into a file, not $(...): find_gpu's exports must stay in this shell.)
    find_gpu > "$pack/gpu.txt" || { tee "$OUT/summary.txt" < "$pack/gpu.txt"; exit 1; }
    gpu_line=$(cat "$pack/gpu.txt")
    dev=CUDA0; [ "$vendor" = hip ] && dev=HIP0
    export SHARDGRAPH_REQUIRE_GPU=1
  fi
  export SHARDGRAPH_REQUIRE_GGML=1
  [ "$vendor" = cuda ] && export SHARDGRAPH_REQUIRE_NVRTC=1
  export GGML_LIB_DIR="$PWD/$pack/ggml"
  export GGML_0_25_LIB_DIR="$PWD/$pack/ggml25"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$GGML_LIB_DIR"
  # Each process prints its NVRTC compile counts at exit. What the run
  # writes (the compiled kernels, fresh for each run so the counts are
  # honest; the main job's models) stays out of the pack, which is carried.
  local scratch="${TMPDIR:-/tmp}/shardgraph-gpu-check"
  rm -rf "$scratch"; mkdir -p "$scratch"
  export SHARDGRAPH_NVRTC_STATS=1 SHARDGRAPH_KERNEL_CACHE="$scratch/kernels" RUST_BACKTRACE=0
  {
    echo "gpu-check $mode$([ "$dry" = 1 ] && echo ' --dry')$([ "$echo_only" = 1 ] && echo ' --echo') $(date -u +%FT%TZ) on $(hostname 2>/dev/null), $(nproc) CPUs; budget $budget s"
    echo "pack: $(cat "$pack/build" 2>/dev/null || echo '?')"
    [ -n "$gpu_line" ] && echo "$gpu_line"
  } | tee -a "$sum" "$log"
  cp "$sum" "$OUT/summary.txt"

  local two="$dev,$dev" models="$scratch/models"
  local split=(env SHARDGRAPH_TEST_DEVICES="$vendor" PROPTEST_CASES=24 PROPTEST_MAX_SHRINK_ITERS=64 PROPTEST_MAX_SHRINK_TIME=20000)
  if [ "$vendor" = hip ]; then
    step backend 240 "hipRTC compile + load of every kernel, HIP backend tests" "$bin/hip_backend" --nocapture --test-threads 4
    step diff 150 "hip_diff (ggml suite on the HIP backend)" "$bin/ggml_diff" hip_diff --exact --nocapture
    step main 120 "main job: dflash2 example (its own qwen3 + DFlash2), $dev x2, --verify" \
      "$bin/dflash2" --device "$two" --n-predict 32 --verify
  else
    step versions 150 "NVRTC loaded, driver, GPU; every kernel compiled for the GPU and loaded" \
      "$bin/cuda_kernels" versions --exact --nocapture
    step kernels 90 "kernel compile check for sm_90 and load of every kernel" \
      env SHARDGRAPH_NVRTC_ARCHS=sm_90 "$bin/cuda_kernels" --nocapture
    step backend 150 "CUDA backend tests (decode and speculative on 1-2 devices = CPU; errors)" \
      "$bin/cuda_backend" --nocapture --test-threads 4
    step diff 150 "cuda_diff: the ggml suite on the CUDA backend, cuBLAS on" \
      "$bin/ggml_diff" cuda_diff --exact --nocapture
    step diff-own-gemm 90 "cuda_diff's mul_mat cases with cuBLAS off (our GEMM kernels)" \
      env SHARDGRAPH_CUBLAS=0 GGML_DIFF_FILTER=mul_mat "$bin/ggml_diff" cuda_diff --exact --nocapture
    step main 90 "main job: dflash2 example, small qwen3 + DFlash2, $dev x2, --verify" \
      bash -c 'SHARDGRAPH_BENCH_WRITE_MODELS="$1" "$2" && "$3" --model "$1/qwen3-small.gguf" --model-draft "$1/dflash2-small.gguf" --device "$4" --n-predict 48 --verify' \
      _ "$models" "$bin/cuda" "$bin/dflash2" "$two"
  fi
  step split-regressions 90 "split regressions on virtual devices" "${split[@]}" "$bin/split_regressions" --test-threads 4
  step split-store 90 "split store on virtual devices" "${split[@]}" "$bin/split_store" --test-threads 4
  step split-props 120 "split properties (24 cases) on virtual devices" "${split[@]}" "$bin/split_props" --test-threads 4
  step mtp 90 "mtp example (qwen35 + MTP), $dev x3, --verify" "$bin/mtp" --device "$dev,$dev,$dev" --n-predict 32 --verify
  step dflash2-qwen35 90 "dflash2 example on the qwen35 hybrid, $dev x2, --verify" \
    "$bin/dflash2" --target qwen35 --device "$two" --n-predict 32 --verify
  if [ "$vendor" = cuda ]; then
    step bench 60 "bench: matvec GB/s per type; decode tokens/s, small qwen3, 1 and 2 devices" \
      env SHARDGRAPH_BENCH_SECS=0.3 SHARDGRAPH_BENCH_CPU=0 SHARDGRAPH_BENCH_MODEL=small "$bin/cuda"
  fi
  if [ "$echo_only" = 1 ]; then
    echo "gpu-check: the limits add up to $limits s; the budget of $budget s cuts each step to what is left and skips a step when less than 10 s is" | tee -a "$sum"
    cp "$sum" "$OUT/summary.txt"
    return 0
  fi
  echo "gpu-check: $passed ok, $failed failed or timed out, $skipped skipped, in $(( $(date +%s) - start )) s; log $log" | tee -a "$sum"
  cp "$sum" "$OUT/summary.txt"
  [ "$failed" = 0 ] || exit 1
}

case "$mode" in
  pack) build_and_pack "$@" ;;
  run) run_packed "$@" ;;
  all) build_and_pack && run_packed ;;
  *) echo "usage: scripts/gpu-check.sh [pack [--emu] | run [--dry | --echo]]"; exit 2 ;;
esac
