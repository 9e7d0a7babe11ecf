#!/usr/bin/env bash
# Set-up for a fresh machine: installs the test oracle (the real ggml 0.15.3,
# built from source by the PyPI package ggml-python 0.0.45), the GGUF
# reference implementation (the PyPI package gguf 0.19.0, for tests/gguf.rs),
# llama.cpp itself (llama-cpp-python 0.3.36, for tests/llama_cpp.rs) and
# NVRTC (nvidia-cuda-nvrtc, for the CUDA kernel compile check in
# tests/cuda_kernels.rs) into ./.venv, and Debian's ROCm 5.2 `hipcc` and
# `libamdhip64-dev` (for the HIP kernel compile check in tests/hip_kernels.rs;
# apt-get, when run as root on Debian/Ubuntu, else a message saying how).
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
if ! .venv/bin/python -c "import ggml, os, sys; d=os.path.join(os.path.dirname(ggml.__file__),'lib'); sys.exit(0 if os.path.exists(os.path.join(d,'libggml-cpu.so')) else 1)" 2>/dev/null; then
  echo "setup: building ggml 0.15.3 via pip install ggml-python==0.0.45 (about 2 minutes on 2 cores)"
  .venv/bin/pip install --quiet --disable-pip-version-check ggml-python==0.0.45
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
.venv/bin/python -c "import ggml, os; print('setup: ggml oracle at', os.path.join(os.path.dirname(ggml.__file__), 'lib'))"
.venv/bin/python -c "import gguf, importlib.metadata as m; print('setup: gguf', m.version('gguf'), 'at', gguf.__path__[0])"
.venv/bin/python -c "import importlib.metadata as m; print('setup: llama-cpp-python', m.version('llama_cpp_python'))"
.venv/bin/python -c "import importlib.metadata as m, glob, sys; d = glob.glob(sys.prefix + '/lib/python3*/site-packages/nvidia/cu13/lib'); print('setup: NVRTC', m.version('nvidia-cuda-nvrtc'), 'at', d[0] if d else '?')"
if command -v hipcc >/dev/null; then echo "setup: hipcc at $(command -v hipcc)"; fi
