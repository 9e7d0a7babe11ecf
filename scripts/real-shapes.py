#!/usr/bin/env python3
"""Side-by-side speed on files of real Qwen3 widths, written by llama.cpp's quantizer.

For each shape (the Qwen3 checkpoints' config.json: hidden size, FFN size,
heads, KV heads, head dim, vocabulary 151936; 0.6B with its head tied to
the embedding, as the checkpoint has it) this script writes an F16 GGUF
with random weights (gguf-py), turns it into each file type with
llama.cpp's own quantizer (`llama_model_quantize` of the set-up's
llama-cpp-python 0.3.36, which picks the type per tensor: Q4_K_M gives
Q6_K to some `attn_v`/`ffn_down`, Q4_K elsewhere), and times shardgraph's
`decode` example and llama.cpp on that same file with the same threads:
decode at position 16, decode at position 4000 (optional), prefill of 512
tokens. Files go under $TMPDIR (default /tmp) and are removed afterwards
unless --keep; none are committed.

Usage (after `cargo build --release --examples`):
    .venv/bin/python scripts/real-shapes.py [--shapes 0.6b,1.7b,4b] [--ftypes q8_0,q4_k_m]
        [--layers N] [--threads 2] [--repeat 1] [--at-4000] [--rows 16,512,4000] [--keep] [--prepare]

--layers N keeps the real widths with N layers (the per-layer cost is the
real one; the head's share of the time grows): say so when quoting.
"""

import argparse
import ctypes
import importlib.util
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("bench", os.path.join(ROOT, "scripts", "bench-vs-llama.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

# (hidden, ffn, layers, heads, kv heads, head dim, tied): the checkpoints' config.json.
SHAPES = {
    "0.6b": (1024, 3072, 28, 16, 8, 128, True),
    "1.7b": (2048, 6144, 28, 16, 8, 128, False),
    "4b": (2560, 9728, 36, 32, 8, 128, False),
}
VOCAB = 151936
FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "f16": None}


def write_f16(path, shape, n_layer):
    """An F16 qwen3 GGUF with random weights (a tiled random block: fast,
    and incompressible enough for timing) of these widths."""
    import gguf

    e, f, _, h, hkv, d, tied = shape
    rng = np.random.default_rng(7)
    block = (rng.standard_normal(1 << 22) * 0.02).astype(np.float16)

    def w(rows, cols):
        return np.resize(block, rows * cols).reshape(rows, cols)

    ones = lambda n: np.ones(n, dtype=np.float32)
    g = gguf.GGUFWriter(path, "qwen3")
    g.add_uint32("qwen3.block_count", n_layer)
    g.add_uint32("qwen3.context_length", 40960)
    g.add_uint32("qwen3.embedding_length", e)
    g.add_uint32("qwen3.feed_forward_length", f)
    g.add_uint32("qwen3.attention.head_count", h)
    g.add_uint32("qwen3.attention.head_count_kv", hkv)
    g.add_uint32("qwen3.attention.key_length", d)
    g.add_uint32("qwen3.attention.value_length", d)
    g.add_float32("qwen3.rope.freq_base", 1e6)
    g.add_float32("qwen3.attention.layer_norm_rms_epsilon", 1e-6)
    g.add_uint32("qwen3.vocab_size", VOCAB)
    g.add_string("tokenizer.ggml.model", "no_vocab")
    g.add_tensor("token_embd.weight", w(VOCAB, e))
    g.add_tensor("output_norm.weight", ones(e))
    if not tied:
        g.add_tensor("output.weight", w(VOCAB, e))
    for il in range(n_layer):
        p = f"blk.{il}."
        g.add_tensor(p + "attn_norm.weight", ones(e))
        g.add_tensor(p + "attn_q.weight", w(h * d, e))
        g.add_tensor(p + "attn_k.weight", w(hkv * d, e))
        g.add_tensor(p + "attn_v.weight", w(hkv * d, e))
        g.add_tensor(p + "attn_output.weight", w(e, h * d))
        g.add_tensor(p + "attn_q_norm.weight", ones(d))
        g.add_tensor(p + "attn_k_norm.weight", ones(d))
        g.add_tensor(p + "ffn_norm.weight", ones(e))
        g.add_tensor(p + "ffn_gate.weight", w(f, e))
        g.add_tensor(p + "ffn_up.weight", w(f, e))
        g.add_tensor(p + "ffn_down.weight", w(e, f))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def quantize(src, dst, ftype, threads):
    import llama_cpp as L

    p = L.llama_model_quantize_default_params()
    p.ftype = getattr(L, FTYPES[ftype])
    p.nthread = threads
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize {ftype} returned {rc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="0.6b,1.7b,4b")
    ap.add_argument("--ftypes", default="q8_0,q4_k_m")
    ap.add_argument("--layers", type=int, help="layers per model (default: the checkpoint's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="alternating runs per side and row (median)")
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--at-4000", action="store_true", help="also decode at position 4000 (a 4000-token prefill first)")
    ap.add_argument("--rows", help="which rows, of 16 (decode at 16), 512 (prefill) and 4000 (decode at 4000); "
                    "default 16,512 (and 4000 with --at-4000)")
    ap.add_argument("--keep", action="store_true", help="keep the files")
    ap.add_argument("--prepare", action="store_true", help="only write and quantize the files (kept), time nothing")
    a = ap.parse_args()
    tmp = os.environ.get("TMPDIR", "/tmp")
    th, ng = a.threads, a.n_predict
    wanted = (a.rows or ("16,512,4000" if a.at_4000 else "16,512")).split(",")
    if any(r not in ("16", "512", "4000") for r in wanted):
        sys.exit(f"--rows takes 16, 512 and 4000, not {a.rows}")
    print(f"{'file':<34} {'setting':<26} {'ours':>8} {'llama':>8} {'ratio':>7}", flush=True)
    for name in a.shapes.split(","):
        shape = SHAPES[name]
        n_layer = a.layers or shape[2]
        f16 = os.path.join(tmp, f"shardgraph-real-qwen3-{name}-{n_layer}l-f16.gguf")
        if not os.path.exists(f16):
            t = time.perf_counter()
            write_f16(f16, shape, n_layer)
            print(f"# wrote {f16} ({os.path.getsize(f16) / 2**30:.2f} GiB, {time.perf_counter() - t:.0f} s)", flush=True)
        for ft in a.ftypes.split(","):
            path = f16 if ft == "f16" else f16.replace("-f16.gguf", f"-{ft}.gguf")
            if not os.path.exists(path):
                t = time.perf_counter()
                quantize(f16, path, ft, th)
                print(f"# quantized {os.path.basename(path)} ({os.path.getsize(path) / 2**30:.2f} GiB, "
                      f"{time.perf_counter() - t:.0f} s)", flush=True)
            if a.prepare:
                continue
            bench.MODEL = path
            llama = bench.Llama(path)
            every = {"16": ("decode at 16", (th, 1, 4096, 16, ng), (th, 4096, 16, ng), 1),
                     "512": ("prefill 512", (th, 1, 4096, 512, 1), (th, 4096, 512, 1), 0),
                     "4000": ("decode at 4000", (th, 1, 8192, 4000, ng), (th, 8192, 4000, ng), 1)}
            rows = [every[r] for r in wanted]
            label = f"{name}{' tied' if shape[6] else ''} {n_layer}l {ft}"
            for what, oc, lc, k in rows:
                mine, theirs = [], []
                for _ in range(a.repeat):
                    mine.append(bench.ours_decode(*oc)[k])
                    theirs.append(llama.run(*lc)[k])
                m, t = statistics.median(mine), statistics.median(theirs)
                print(f"{label:<34} {what:<26} {m:8.1f} {t:8.1f} {m / t:6.2f}x", flush=True)
            llama.L.llama_model_free(llama.model)
            if not a.keep and path != f16:
                os.remove(path)
        if not a.keep and not a.prepare:
            os.remove(f16)


if __name__ == "__main__":
    main()
