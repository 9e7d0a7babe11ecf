#!/usr/bin/env python3
"""llama.cpp on shardgraph: runs one GGUF in llama.cpp (llama-cpp-python
0.3.36 of the set-up) twice, on its own CPU backend and with every layer on
the `SG` device of shardgraph's ggml backend library, and compares them.

    .venv/bin/python scripts/llama-on-sg.py --lib target/release/libshardgraph_ggml.so \
        --model F [--prompt 1,2,3] [--n-gen 32] [--threads 2] [--parallel 1] [--json]

Prints, per side, the scheduler's graph splits (llama.cpp's own log line,
`graph: nodes = N, splits = S`, one per reserved graph),
then the prompt's and every greedy step's logits NMSE (SG against CPU), the
first step whose greedy token differs (with that step's top-2 margin on
the CPU side) and tokens/s of both. `--json` prints one JSON object instead
(the tests read it). Exits 1 when the library does not load.
"""
import argparse
import ctypes
import json
import os
import re
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="libshardgraph_ggml.so")
    ap.add_argument("--model", required=True, help="a GGUF file llama.cpp loads")
    ap.add_argument("--prompt", default="1,2,3,4,5,6,7,8", help="token ids, comma-separated")
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--parallel", type=int, default=1,
                    help="sequence slots (llama.cpp's --parallel, n_seq_max); the run uses the last one")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="llama.cpp's log on stderr")
    a = ap.parse_args()
    if a.parallel < 1:
        ap.error("--parallel must be at least 1")
    prompt = [int(t) for t in a.prompt.split(",") if t]
    if not prompt:
        ap.error("--prompt needs at least one token id")

    import llama_cpp as L

    # llama.cpp's log lines, kept (the split counts are read from them) and
    # echoed to stderr with --verbose.
    lines = []

    @L.llama_log_callback
    def on_log(level, text, user):
        line = text.decode(errors="replace") if text else ""
        lines.append(line)
        if a.verbose:
            sys.stderr.write(line)

    L.llama_log_set(on_log, None)
    L.llama_backend_init()
    libdir = os.path.join(os.path.dirname(L.__file__), "lib")
    ggml = ctypes.CDLL(os.path.join(libdir, "libggml.so"))
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    reg = ggml.ggml_backend_load(os.path.abspath(a.lib).encode())
    dev = ggml.ggml_backend_dev_by_name(b"SG") if reg else None
    if not dev:
        sys.stderr.write("".join(lines))
        print("llama-on-sg: the library did not load (llama.cpp's log above)", file=sys.stderr)
        sys.exit(1)
    runs, splits = {}, {}
    for side in ("CPU", "SG"):
        first = len(lines)
        runs[side] = run(L, a, prompt, dev if side == "SG" else None)
        splits[side] = [int(x) for l in lines[first:] for x in re.findall(r"graph: nodes = \d+, splits = (\d+)", l)]
    report(a, runs, splits)


def run(L, a, prompt, dev):
    mp = L.llama_model_default_params()
    keep = None
    if dev is None:
        mp.n_gpu_layers = 0
        keep = (ctypes.c_void_p * 1)(None)
    else:
        mp.n_gpu_layers = 999
        keep = (ctypes.c_void_p * 2)(dev, None)
    mp.devices = ctypes.cast(keep, ctypes.c_void_p)
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    assert model, f"llama.cpp could not load {a.model}"
    cp = L.llama_context_default_params()
    cp.n_ctx = a.ctx_size
    # Every slot may output a row (llama.cpp sizes its output buffer by
    # n_batch and checks it against n_seq_max).
    cp.n_batch = cp.n_ubatch = max(len(prompt), 8, a.parallel)
    cp.n_threads = cp.n_threads_batch = a.threads
    cp.n_seq_max = a.parallel
    ctx = L.llama_init_from_model(model, cp)
    assert ctx, "llama.cpp could not create a context"
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

    def decode(ids, start):
        b = L.llama_batch_init(len(ids), 0, 1)
        for i, t in enumerate(ids):
            b.token[i] = t
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = a.parallel - 1
            b.logits[i] = 1
        b.n_tokens = len(ids)
        rc = L.llama_decode(ctx, b)
        assert rc == 0, f"llama_decode returned {rc}"
        rows = [list(ctypes.cast(L.llama_get_logits_ith(ctx, i), ctypes.POINTER(ctypes.c_float))[:n_vocab]) for i in range(len(ids))]
        L.llama_batch_free(b)
        return rows

    t0 = time.perf_counter()
    rows = decode(prompt, 0)
    t1 = time.perf_counter()
    gen, steps, last, pos = [], [], rows[-1], len(prompt)
    for _ in range(a.n_gen):
        t = max(range(n_vocab), key=lambda i: last[i])
        gen.append(t)
        last = decode([t], pos)[0]
        pos += 1
        steps.append(last)
    t2 = time.perf_counter()
    L.llama_free(ctx)
    L.llama_model_free(model)
    return {
        "prompt_rows": rows,
        "gen": gen,
        "steps": steps,
        "prefill_tps": len(prompt) / (t1 - t0),
        "decode_tps": a.n_gen / (t2 - t1) if a.n_gen else 0.0,
    }


def nmse(x, y):
    num = sum((a - b) ** 2 for a, b in zip(x, y))
    den = sum(a * a for a in x) or 1.0
    return num / den


def margin(row):
    top = sorted(row, reverse=True)[:2]
    return top[0] - top[1] if len(top) == 2 else float("inf")


def report(a, runs, splits):
    cpu, sg = runs["CPU"], runs["SG"]
    prompt_nmse = max(nmse(x, y) for x, y in zip(cpu["prompt_rows"], sg["prompt_rows"]))
    # Step k's logits compare only while both sides decoded the same tokens.
    same = 0
    while same < len(cpu["gen"]) and cpu["gen"][same] == sg["gen"][same]:
        same += 1
    step_nmse = [nmse(x, y) for x, y in zip(cpu["steps"][:same], sg["steps"][:same])]
    first_diff = None if same == len(cpu["gen"]) else same
    diff_margin = None
    if first_diff is not None:
        row = cpu["prompt_rows"][-1] if first_diff == 0 else cpu["steps"][first_diff - 1]
        diff_margin = margin(row)
    out = {
        "splits": splits,
        "prompt_nmse": prompt_nmse,
        "max_step_nmse": max(step_nmse) if step_nmse else 0.0,
        "tokens_equal": first_diff is None,
        "first_diff": first_diff,
        "first_diff_cpu_margin": diff_margin,
        "gen_cpu": cpu["gen"],
        "gen_sg": sg["gen"],
        "tps": {s: {"prefill": r["prefill_tps"], "decode": r["decode_tps"]} for s, r in runs.items()},
    }
    if a.json:
        print(json.dumps(out))
        return
    print(f"graph splits: CPU {splits.get('CPU')}, SG {splits.get('SG')}")
    print(f"prompt logits NMSE (SG vs CPU): {prompt_nmse:.3e}; greedy steps: max NMSE {out['max_step_nmse']:.3e}")
    if first_diff is None:
        print(f"greedy tokens: identical over {len(cpu['gen'])} steps")
    else:
        print(f"greedy tokens: first differ at step {first_diff} (CPU top-2 margin there {diff_margin:.3g})")
    for s, r in out["tps"].items():
        print(f"{s}: prefill {r['prefill']:.1f} tokens/s, decode {r['decode']:.1f} tokens/s")


if __name__ == "__main__":
    main()
