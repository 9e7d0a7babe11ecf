#!/usr/bin/env bash
# Set-up for a fresh machine: installs the test oracle (the real ggml 0.15.3,
# built from source by the PyPI package ggml-python 0.0.45), the GGUF
# reference implementation (the PyPI package gguf 0.19.0, for tests/gguf.rs),
# llama.cpp itself (llama-cpp-python 0.3.36, for tests/llama_cpp.rs) and
# NVRTC (nvidia-cuda-nvrtc, for the CUDA kernel compile check in
# tests/cuda_kernels.rs) into ./.venv, and Debian's ROCm 5.2 `hipcc` and
# `libamdhip64-dev` (for the HIP kernel compile check in tests/hip_kernels.rs;
# apt-get, when run as root on Debian/Ubuntu, else a message saying how), and
# Open MPI with libclang (for the `mpi` feature: its bindings run bindgen;
# tests/mpi_ranks.rs runs processes under mpirun; apt-get as well).
# Idempotent: a second run only checks that they are there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  echo "setup: python3 not found; install Python 3.9+ with venv and pip" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# ggml 0.15.3 builds for the host CPU (-march=native); on a CPU with
# AVX512-FP16 its F16 products then accumulate in half precision (its
# llamafile sgemm), which makes it no oracle for F16 mul_mat (NMSE ~4e-7
# against the exact products, measured on a Xeon with AVX512-FP16). Build it
# without those instructions there (the marker file records how it was built).
GGML_MARK=.venv/ggml-0.15.3-build
GGML_FLAGS=""
if grep -qw avx512_fp16 /proc/cpuinfo 2>/dev/null; then
  GGML_FLAGS="-mno-avx512fp16"
fi
GGML_ARGS=(--quiet --disable-pip-version-check --no-cache-dir)
if ! .venv/bin/python -c "import ggml, os, sys; d=os.path.join(os.path.dirname(ggml.__file__),'lib'); sys.exit(0 if os.path.exists(os.path.join(d,'libggml-cpu.so')) else 1)" 2>/dev/null; then
  GGML_BUILD=1
elif [ "$(cat "$GGML_MARK" 2>/dev/null)" != "flags:$GGML_FLAGS" ]; then
  # Built with other flags: replaced, its dependencies kept.
  GGML_BUILD=1
  GGML_ARGS+=(--force-reinstall --no-deps)
else
  GGML_BUILD=0
fi
if [ "$GGML_BUILD" = 1 ]; then
  echo "setup: building ggml 0.15.3 via pip install ggml-python==0.0.45 (about 2 minutes on 2 cores; C flags: ${GGML_FLAGS:-none})"
  # --no-cache-dir: never a wheel built earlier with other flags.
  CMAKE_ARGS="-DCMAKE_C_FLAGS=$GGML_FLAGS -DCMAKE_CXX_FLAGS=$GGML_FLAGS" .venv/bin/pip install "${GGML_ARGS[@]}" ggml-python==0.0.45
  echo "flags:$GGML_FLAGS" > "$GGML_MARK"
fi
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('gguf') == '0.19.0' else 1)" 2>/dev/null; then
  echo "setup: installing the GGUF reference (pip install gguf==0.19.0)"
  .venv/bin/pip install --quiet --disable-pip-version-check gguf==0.19.0
fi
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('llama_cpp_python') == '0.3.36' else 1)" 2>/dev/null; then
  echo "setup: building llama.cpp via pip install llama-cpp-python==0.3.36 (about 8 minutes on 2 cores)"
  .venv/bin/pip install --quiet --disable-pip-version-check llama-cpp-python==0.3.36
fi
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('nvidia-cuda-nvrtc') == '13.5.37' else 1)" 2>/dev/null; then
  echo "setup: installing NVRTC for the CUDA kernel compile check (pip install nvidia-cuda-nvrtc==13.5.37, no GPU needed)"
  .venv/bin/pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.5.37
fi
if ! command -v hipcc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing hipcc and libamdhip64-dev (ROCm 5.2, apt-get; about 500 MB, 20 s) for the HIP kernel compile check"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q hipcc libamdhip64-dev >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q hipcc libamdhip64-dev >/dev/null; }
  else
    echo "setup: hipcc not found: the HIP kernel compile check (tests/hip_kernels.rs) will be skipped;" \
         "install it with: sudo apt-get install hipcc libamdhip64-dev (Debian 12), or ROCm's own packages"
  fi
fi
# Open MPI (the `mpi` feature's library, `mpirun` for tests/mpi_ranks.rs) and
# libclang (the `mpi` crate generates its bindings with bindgen). Open MPI
# rather than Debian's MPICH 4.0.2: MPICH's UCX device hangs in
# MPI_Finalize about one run in five when forced onto TCP.
if ! command -v mpicc >/dev/null || ! mpirun --version 2>/dev/null | grep -q "Open MPI" \
   || ! ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Open MPI and libclang (apt-get: libopenmpi-dev openmpi-bin libclang-dev) for the mpi feature"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libopenmpi-dev openmpi-bin libclang-dev >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libopenmpi-dev openmpi-bin libclang-dev >/dev/null; }
  else
    echo "setup: Open MPI or libclang not found: the mpi feature will not build;" \
         "install them with: sudo apt-get install libopenmpi-dev openmpi-bin libclang-dev (Debian 12)"
  fi
fi
# llama.cpp's own source and tools, for shardgraph-ggml (the ggml backend
# library): the llama-cpp-python 0.3.36 source distribution (the tree its
# libllama was built from: ggml 0.25.3's headers, tests/test-backend-ops.cpp)
# unpacked into the cache folder, and ggml's test-backend-ops built from it
# and llama-bench (cmake and ninja from pip; about 8 minutes on 2 cores, once per CPU: the
# build is -march=native, so a marker records the CPU's flags).
CACHE=${SHARDGRAPH_CACHE:-$HOME/.cache/shardgraph}
LLAMA_SDIST=llama_cpp_python-0.3.36
LLAMA_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_SRC="$CACHE/$LLAMA_SDIST/vendor/llama.cpp"
if [ ! -f "$LLAMA_SRC/ggml/src/ggml-backend-impl.h" ]; then
  echo "setup: fetching llama.cpp's source ($LLAMA_SDIST.tar.gz, 77 MB) into $CACHE"
  mkdir -p "$CACHE"
  .venv/bin/python - "$CACHE" "$LLAMA_SDIST" "$LLAMA_SHA256" <<'PY'
import hashlib, re, sys, tarfile, urllib.request, os
cache, name, sha = sys.argv[1:4]
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
url = next(u for u in re.findall(r'href="([^"#]+)', index) if u.endswith(name + ".tar.gz"))
data = urllib.request.urlopen(url).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"setup: {url} does not have the pinned sha256 {sha}")
path = os.path.join(cache, name + ".tar.gz")
open(path, "wb").write(data)
with tarfile.open(path) as t:
    t.extractall(cache)
os.remove(path)
PY
fi
if ! .venv/bin/python -c "import cmake, ninja" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check cmake ninja
fi
LLAMA_BUILD="$CACHE/llama-0.3.36-build"
LLAMA_MARK="src:$LLAMA_SRC cpu:$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)"
if [ ! -x "$LLAMA_BUILD/bin/test-backend-ops" ] || [ ! -x "$LLAMA_BUILD/bin/llama-bench" ] || [ "$(cat "$LLAMA_BUILD/.shardgraph-mark" 2>/dev/null)" != "$LLAMA_MARK" ]; then
  echo "setup: building llama.cpp's test-backend-ops and llama-bench in $LLAMA_BUILD (about 8 minutes on 2 cores)"
  if [ "$(cat "$LLAMA_BUILD/.shardgraph-mark" 2>/dev/null)" != "$LLAMA_MARK" ]; then rm -rf "$LLAMA_BUILD"; fi
  PATH="$PWD/.venv/bin:$PATH" cmake -S "$LLAMA_SRC" -B "$LLAMA_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON -DBUILD_SHARED_LIBS=ON >/dev/null
  PATH="$PWD/.venv/bin:$PATH" ninja -C "$LLAMA_BUILD" test-backend-ops llama-bench >/dev/null
  echo "$LLAMA_MARK" > "$LLAMA_BUILD/.shardgraph-mark"
fi
# llama.cpp's speculative loop: llama-speculative-simple with
# scripts/llama-spec-simple.patch (the prompt as token ids, one line per
# step), for the seeds' DFlash2 command on SG (shardgraph-ggml's tests) and
# scripts/llama-spec-compare.py; its own build tree in $CACHE/llama-tools
# (about 5 minutes on 2 cores, once per CPU and patch).
PATH="$PWD/.venv/bin:$PATH" LLAMA_CPP_SRC="$LLAMA_SRC" SHARDGRAPH_LLAMA_TOOLS="$CACHE/llama-tools" \
  .venv/bin/python scripts/llama-spec-compare.py --build-only 2>/dev/null \
  | sed 's/^/setup: llama-speculative-simple at /'
.venv/bin/python -c "import ggml, os; print('setup: ggml oracle at', os.path.join(os.path.dirname(ggml.__file__), 'lib'))"
.venv/bin/python -c "import gguf, importlib.metadata as m; print('setup: gguf', m.version('gguf'), 'at', gguf.__path__[0])"
.venv/bin/python -c "import importlib.metadata as m; print('setup: llama-cpp-python', m.version('llama_cpp_python'))"
.venv/bin/python -c "import importlib.metadata as m, glob, sys; d = glob.glob(sys.prefix + '/lib/python3*/site-packages/nvidia/cu13/lib'); print('setup: NVRTC', m.version('nvidia-cuda-nvrtc'), 'at', d[0] if d else '?')"
if command -v hipcc >/dev/null; then echo "setup: hipcc at $(command -v hipcc)"; fi
echo "setup: llama.cpp source at $LLAMA_SRC, test-backend-ops and llama-bench at $LLAMA_BUILD/bin"
