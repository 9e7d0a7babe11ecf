"""What the test scripts share: llama.cpp (llama-cpp-python) with its log
kept in `lines`, and SG loaded from the library at `lib`."""
import ctypes
import os
import sys

import llama_cpp as L

lines = []


@L.llama_log_callback
def _keep(level, text, user):
    lines.append(text.decode(errors="replace") if text else "")


def load(lib):
    """Starts llama.cpp, loads `lib` into its ggml and returns the SG device
    (exits with a message when the library does not load)."""
    L.llama_log_set(_keep, None)
    L.llama_backend_init()
    ggml = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libggml.so"))
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    if not ggml.ggml_backend_load(lib.encode()):
        sys.exit(f"cannot load {lib}")
    return ggml.ggml_backend_dev_by_name(b"SG")
