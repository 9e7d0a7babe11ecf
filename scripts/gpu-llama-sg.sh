#!/usr/bin/env bash
# The seeds' command (issue 27) on a GPU machine: llama.cpp's own speculative
# loop (the set-up's llama-speculative-simple, patched by
# scripts/llama-spec-simple.patch) with the DFlash2 example pair, on one CPU
# device and with both models on SG over virtual devices of GPU 0, compared
# step by step (drafts, accepted counts, tokens).
#
#   scripts/gpu-llama-sg.sh pack   here (after scripts/setup.sh): the CUDA build of
#                                  libshardgraph_ggml.so, the dflash2 example (it writes
#                                  the pair on the GPU machine) and llama.cpp's tool and
#                                  libraries into .gpu-llama/ (about 24 MiB)
#   scripts/gpu-llama-sg.sh run [DEVICES]
#                                  there (a device call carrying .gpu-llama; no Rust needed):
#                                  DEVICES default CUDA0,CUDA0; CPU,CPU works anywhere
#
# Prints each run's step count, drafted/accepted counts and speed, `steps
# equal …` or `steps DIFFER` (exit 1), and SG's exchange counts. Seen on an
# H200 on 2026-12-04: 12 steps equal, 67 drafted, 43 accepted (BENCHMARKS.md).
set -uo pipefail
cd "$(dirname "$0")/.."
pack=.gpu-llama
case "${1:-}" in
pack)
  tools="${SHARDGRAPH_CACHE:-$HOME/.cache/shardgraph}/llama-tools/build/bin"
  [ -x "$tools/llama-speculative-simple" ] || { echo "gpu-llama-sg: no $tools/llama-speculative-simple (run scripts/setup.sh)" >&2; exit 1; }
  cargo build --release -p shardgraph-ggml --features cuda && cargo build --release --features cuda --example dflash2 || exit 1
  out="${CARGO_TARGET_DIR:-target}/release"
  rm -rf "$pack" && mkdir -p "$pack" && cp -a "$tools"/. "$pack"/ &&
    cp "$out/libshardgraph_ggml.so" "$out/examples/dflash2" "$pack"/ || { rm -rf "$pack"; exit 1; }
  strip "$pack"/libshardgraph_ggml.so "$pack"/dflash2 2>/dev/null
  grep -qx "/$pack" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$pack" >> .git/info/exclude; }
  echo "gpu-llama-sg: packed $(du -sh "$pack" | cut -f1) in $pack; device call: carry [\"$pack\"], command: scripts/gpu-llama-sg.sh run"
  ;;
run)
  dev="${2:-CUDA0,CUDA0}" H="$PWD/$pack" W="${TMPDIR:-/tmp}/sg-llama"
  for f in libshardgraph_ggml.so dflash2 llama-speculative-simple; do
    [ -f "$H/$f" ] || { echo "gpu-llama-sg: $pack/$f missing (scripts/gpu-llama-sg.sh pack)" >&2; exit 1; }
  done
  # (In case the copy to the device machine dropped the execute bits.)
  chmod +x "$H"/llama-speculative-simple "$H"/dflash2 2>/dev/null
  mkdir -p "$W"
  export LD_LIBRARY_PATH="$H:${LD_LIBRARY_PATH:-}" SHARDGRAPH_KERNEL_CACHE="$W/kernels"
  if [ -e /usr/local/cuda/lib64/libnvrtc.so.13 ]; then
    export SHARDGRAPH_NVRTC_DIR=/usr/local/cuda/lib64
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64:$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)/nvidia/cu13/lib"
  fi
  # The example pair: the dflash2 example writes it into the temp folder on first use.
  "$H/dflash2" --device CPU --n-predict 2 > "$W/write.txt" 2>&1 || { tail -5 "$W/write.txt"; exit 1; }
  t="${TMPDIR:-/tmp}/shardgraph-example-qwen3-q4_k_m.gguf" d="${TMPDIR:-/tmp}/shardgraph-example-dflash2-q8_0.gguf"
  args=(-m "$t" -md "$d" --spec-type draft-dflash --spec-draft-n-max 6 --ctx-size 65536 --cache-type-k q4_0
        --cache-type-v q4_0 -p 11,400,789,1178,1567,1956,345,734 -n 48 --temp 0 -t 2)
  "$H/llama-speculative-simple" "${args[@]}" > "$W/cpu.out" 2> "$W/cpu.err"; echo "llama.cpp on one CPU device: exit $?"
  GGML_BACKEND_PATH="$H/libshardgraph_ggml.so" SHARDGRAPH_DEVICES="$dev" SHARDGRAPH_GGML_VERBOSE=1 \
    "$H/llama-speculative-simple" "${args[@]}" --device SG --device-draft SG -ngl 99 -ngld 99 > "$W/sg.out" 2> "$W/sg.err"
  echo "llama.cpp with both models on SG = $dev: exit $?"
  for r in cpu sg; do
    echo "$r: $(grep -c '^step ' "$W/$r.out") step lines; $(grep -E 'n_drafted|n_accept|decoded' "$W/$r.err" | sed 's/^[0-9.]* I //' | tr -s ' ' | paste -sd ';')"
  done
  grep -E "sub-devices:|GGML_ASSERT|abort" "$W/sg.err" | cut -c1-300
  if [ -s "$W/cpu.out" ] && cmp -s <(grep '^step ' "$W/cpu.out") <(grep '^step ' "$W/sg.out"); then
    echo "steps equal (drafts, accepted counts, tokens)"
  else
    echo "steps DIFFER:"; diff <(grep '^step ' "$W/cpu.out") <(grep '^step ' "$W/sg.out") | head -8; tail -5 "$W/sg.err"; exit 1
  fi
  ;;
*) echo "usage: scripts/gpu-llama-sg.sh pack | run [DEVICES]" >&2; exit 2 ;;
esac
