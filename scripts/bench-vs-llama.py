#!/usr/bin/env python3
"""Side-by-side speed of shardgraph and llama.cpp on the same GGUF.

Runs the `decode` example (a generated 170 MB Q8_0 `qwen3`, 8 layers) and
llama.cpp (the `llama-cpp-python` 0.3.36 that scripts/setup.sh installs into
./.venv, driven through its C API in this process) on the same file with
the same threads, alternating runs, and prints one table row per setting
with both tokens/s and the ratio (median of --repeat runs each). The
speculative examples (`dflash2`, `mtp`) are compared with plain decoding
at small and large --ctx-size. With --write FILE the table goes into FILE
(BENCHMARKS.md) with the machine and the command.

Usage (after `cargo build --release --examples`):
    .venv/bin/python scripts/bench-vs-llama.py [--threads 2] [--repeat 3] [--write BENCHMARKS.md]

`--batch-cost FILE` times llama.cpp's `llama_decode` of a batch of 1, 2,
4, 8 and 16 tokens (every token's logits, as a speculative verify batch
reads them) at position 32 of FILE, median of 5 each, rolled back
(`llama_memory_seq_rm`), and prints the ratios to one token: the
counterpart of the `decode` example's `--batch-cost 1,2,4,8,16`.

`--model FILE` runs the decode and prefill rows on FILE instead of the
generated qwen3 file (any GGUF both engines load: the `mtp` example's
qwen35 target, a real-shape file from scripts/real-shapes.py). `--quantize
SRC DST --ftype q4_k_m` writes DST from SRC with llama.cpp's own quantizer
(`llama_model_quantize`, requantizing a Q8_0 SRC if need be: for timing
only), e.g. a Q4_K_M qwen35 from the `mtp` example's Q8_0 target.

`--whole-run FILE` instead runs llama.cpp once as a whole process would:
load FILE, a context of --ctx-size cells, a 16-token prompt, --n-predict
decoded tokens (no warm-up), then exit. `farm-bench` times it against the
`decode` example with the same settings (peak memory, load + decode wall
time; the BENCHMARKS.md rows "whole process"):
    farm-bench --vs '.venv/bin/python scripts/bench-vs-llama.py --whole-run F --n-predict 32' \
        -- target/release/examples/decode --model F --threads 2 --n-predict 32
"""

import argparse
import ctypes
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "target", "release", "examples")
NOTES = "<!-- notes: kept when the tables above are rewritten -->"
MODEL = os.path.join(os.environ.get("TMPDIR", "/tmp"), "shardgraph-decode-qwen3-q8_0-random.gguf")


def ours(args):
    """Runs an example; returns its stdout."""
    exe = os.path.join(EXAMPLES, args[0])
    if not os.path.exists(exe):
        sys.exit(f"{exe} is missing: run `cargo build --release --examples` first")
    r = subprocess.run([exe] + args[1:], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def ours_decode(threads, devices, ctx, n_prompt, n_gen):
    out = ours(["decode", "--threads", str(threads), "--devices", str(devices), "--ctx-size", str(ctx),
                "--n-prompt", str(n_prompt), "--n-predict", str(n_gen), "--model", MODEL])
    m = re.search(r"prompt (\d+) tokens ([\d.]+) tokens/s; decode (\d+) tokens ([\d.]+) tokens/s", out)
    if not m:
        sys.exit(f"unexpected decode output: {out}")
    return float(m.group(2)), float(m.group(4))


class Llama:
    """llama.cpp through its C API (llama-cpp-python's bindings)."""

    def __init__(self, path):
        import llama_cpp as L
        self.L = L
        # Silence llama.cpp's log.
        self._cb = L.llama_log_callback(lambda level, text, data: None)
        L.llama_log_set(self._cb, ctypes.c_void_p())
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        if not self.model:
            sys.exit(f"llama.cpp could not load {path}")

    def run(self, threads, ctx, n_prompt, n_gen, ubatch=512, cache_type=1):
        """Prompt and decode tokens/s, as the decode example measures them
        (a warm-up batch first, not timed; flash attention; K and V cache of
        ggml type id `cache_type`: 1 F16, 2 Q4_0, 8 Q8_0)."""
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = ctx
        cp.n_batch = ubatch
        cp.n_ubatch = ubatch
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.type_k = cache_type
        cp.type_v = cache_type
        cp.flash_attn_type = 1
        c = L.llama_init_from_model(self.model, cp)
        if not c:
            sys.exit(f"llama.cpp could not create a context of {ctx} cells")

        def decode(ids, start):
            for at in range(0, len(ids), ubatch):
                part = ids[at:at + ubatch]
                b = L.llama_batch_init(len(part), 0, 1)
                for i, t in enumerate(part):
                    b.token[i] = t
                    b.pos[i] = start + at + i
                    b.n_seq_id[i] = 1
                    b.seq_id[i][0] = 0
                    b.logits[i] = 1 if at + i == len(ids) - 1 else 0
                b.n_tokens = len(part)
                rc = L.llama_decode(c, b)
                L.llama_batch_free(b)
                if rc != 0:
                    sys.exit(f"llama_decode returned {rc}")

        vocab = min(32000, L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model)))
        prompt = [(i * 97 + 5) % vocab for i in range(n_prompt)]
        decode(prompt[:min(n_prompt, ubatch)], 0)
        decode([1], min(n_prompt, ubatch))
        L.llama_memory_clear(L.llama_get_memory(c), True)
        t = time.perf_counter()
        decode(prompt, 0)
        tp = time.perf_counter() - t
        pos = n_prompt
        t = time.perf_counter()
        for i in range(n_gen):
            decode([(i * 31 + 7) % vocab], pos)
            pos += 1
        td = time.perf_counter() - t
        L.llama_free(c)
        return n_prompt / tp, n_gen / td


def quantize(src, dst, ftype, threads):
    """DST from SRC with llama.cpp's quantizer, as `llama-quantize
    --allow-requantize SRC DST FTYPE` would."""
    import llama_cpp as L

    names = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
    if ftype not in names:
        sys.exit(f"--ftype takes {', '.join(names)}, not {ftype}")
    p = L.llama_model_quantize_default_params()
    p.ftype = getattr(L, names[ftype])
    p.nthread = threads
    p.allow_requantize = True
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize {src} -> {dst} ({ftype}) returned {rc}")
    print(f"wrote {dst} ({ftype}) from {src}")


def whole_run(path, threads, ctx, n_prompt, n_gen):
    """llama.cpp as one process: load, prompt, decode, nothing else."""
    llama = Llama(path)
    L = llama.L
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = ctx, 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = 1
    c = L.llama_init_from_model(llama.model, cp)
    if not c:
        sys.exit(f"llama.cpp could not create a context of {ctx} cells")
    pos = 0
    vocab = min(32000, L.llama_vocab_n_tokens(L.llama_model_get_vocab(llama.model)))
    batches = [[(j * 97 + 5) % vocab for j in range(n_prompt)]] + [[(i * 31 + 7) % vocab] for i in range(n_gen)]
    for ids in batches:
        b = L.llama_batch_init(len(ids), 0, 1)
        for k, t in enumerate(ids):
            b.token[k], b.pos[k], b.n_seq_id[k] = t, pos + k, 1
            b.seq_id[k][0] = 0
            b.logits[k] = 1 if k == len(ids) - 1 else 0
        b.n_tokens = len(ids)
        if L.llama_decode(c, b) != 0:
            sys.exit("llama_decode failed")
        L.llama_batch_free(b)
        pos += len(ids)
    L.llama_free(c)
    print(f"llama.cpp: prompt {n_prompt} tokens, decoded {n_gen} tokens")


def batch_cost(path, threads, counts=(1, 2, 4, 8, 16), reps=5):
    """Median ms of one llama_decode of each token count at position 32."""
    llama = Llama(path)
    L = llama.L
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 4096, 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = 1
    c = L.llama_init_from_model(llama.model, cp)
    if not c:
        sys.exit("llama.cpp could not create a context of 4096 cells")
    mem = L.llama_get_memory(c)

    def decode(ids, start, all_logits):
        b = L.llama_batch_init(len(ids), 0, 1)
        for k, t in enumerate(ids):
            b.token[k], b.pos[k], b.n_seq_id[k] = t, start + k, 1
            b.seq_id[k][0] = 0
            b.logits[k] = 1 if all_logits or k == len(ids) - 1 else 0
        b.n_tokens = len(ids)
        rc = L.llama_decode(c, b)
        L.llama_batch_free(b)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")

    vocab = min(32000, L.llama_vocab_n_tokens(L.llama_model_get_vocab(llama.model)))
    decode([(i * 97 + 5) % vocab for i in range(32)], 0, False)
    out = []
    for n in counts:
        times = []
        for rep in range(reps + 1):
            t = time.perf_counter()
            decode([7] * n, 32, True)
            if rep > 0:
                times.append((time.perf_counter() - t) * 1e3)
            if not L.llama_memory_seq_rm(mem, 0, 32, -1):
                sys.exit("llama.cpp cannot remove part of this model's sequence (a recurrent model): "
                         "--batch-cost needs an attention-only model")
        out.append((n, statistics.median(times)))
    L.llama_free(c)
    one = out[0][1]
    print("llama.cpp batch cost: " + ", ".join(f"{n} tokens {ms:.1f} ms ({ms / one:.2f}x)" for n, ms in out))


def spec(example, ctx, threads):
    args = [example, "--devices", "1", "--threads", str(threads), "--n-predict", "96"]
    if ctx:
        args += ["--ctx-size", str(ctx)]
    out = ours(args)
    plain = float(re.search(r"plain greedy: ([\d.]+) tokens/s", out).group(1))
    sp = float(re.search(r"^\S+:\s+([\d.]+) tokens/s; drafted", out, re.M).group(1))
    return plain, sp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="threads of each run (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side and row (median; default 3)")
    ap.add_argument("--n-predict", type=int, default=128, help="decoded tokens per run (default 128)")
    ap.add_argument("--write", help="write the table into this file (BENCHMARKS.md)")
    ap.add_argument("--rows", default="all", help="comma-separated row names to run (default all)")
    once = ap.add_mutually_exclusive_group()
    once.add_argument("--whole-run", metavar="FILE", help="run llama.cpp once on FILE as a whole process and exit")
    once.add_argument("--batch-cost", metavar="FILE", help="time llama.cpp's verify batches of 1-16 tokens on FILE")
    once.add_argument("--quantize", nargs=2, metavar=("SRC", "DST"), help="write DST from SRC (--ftype) and exit")
    ap.add_argument("--ftype", default="q4_k_m", help="file type of --quantize: q8_0 or q4_k_m (default q4_k_m)")
    ap.add_argument("--model", help="the GGUF of the decode and prefill rows (default: the generated qwen3 file)")
    ap.add_argument("--ctx-size", type=int, default=4096, help="cells of --whole-run's context (default 4096)")
    a = ap.parse_args()
    if a.quantize:
        quantize(a.quantize[0], a.quantize[1], a.ftype, a.threads)
        return
    if a.model:
        global MODEL
        MODEL = a.model
    if a.batch_cost:
        batch_cost(a.batch_cost, a.threads)
        return
    if a.whole_run:
        whole_run(a.whole_run, a.threads, a.ctx_size, 16, a.n_predict)
        return
    th, rep, ng = a.threads, a.repeat, a.n_predict
    if a.model and not os.path.exists(MODEL):
        sys.exit(f"--model {MODEL}: no such file")
    if not os.path.exists(MODEL):
        ours(["decode", "--n-predict", "1", "--ctx-size", "256"])  # writes the model
    llama = Llama(MODEL)
    rows = []

    def med(xs):
        return statistics.median(xs)

    def side_by_side(name, what, our_cfg, llama_cfg, pick):
        mine, theirs = [], []
        for _ in range(rep):
            mine.append(pick(ours_decode(*our_cfg)))
            theirs.append(pick(llama.run(*llama_cfg)))
        m, t = med(mine), med(theirs)
        rows.append((name, what, f"{m:.1f}", f"{t:.1f}", f"{m / t:.2f}x"))
        print(f"{name:<34} {what:<30} {m:8.1f} {t:8.1f} {m / t:6.2f}x", flush=True)

    want = None if a.rows == "all" else set(a.rows.split(","))
    dec = lambda r: r[1]
    pre = lambda r: r[0]
    plan = [
        ("decode-512", f"decode, 1 device, 512 cells", (th, 1, 512, 16, ng), (th, 512, 16, ng), dec),
        ("decode-16384", f"decode, 1 device, 16384 cells", (th, 1, 16384, 16, ng), (th, 16384, 16, ng), dec),
        ("decode-65536", f"decode, 1 device, 65536 cells", (th, 1, 65536, 16, ng), (th, 65536, 16, ng), dec),
        ("decode-65536-at-4000", "decode at position 4000 of 65536 cells", (th, 1, 65536, 4000, ng),
         (th, 65536, 4000, ng), dec),
        ("prefill-512", "prefill, 512-token prompt", (th, 1, 4096, 512, 1), (th, 4096, 512, 1), pre),
        ("devices-2", f"decode, 2 devices x 1 thread", (1, 2, 4096, 16, ng), (th, 4096, 16, ng), dec),
        ("devices-3", f"decode, 3 devices x 1 thread", (1, 3, 4096, 16, ng), (th, 4096, 16, ng), dec),
    ]
    print(f"{'row':<34} {'setting':<30} {'ours':>8} {'llama':>8} {'ratio':>7}")
    for key, what, oc, lc, pick in plan:
        if want is None or key in want:
            side_by_side(key, what, oc, lc, pick)
    spec_rows = []
    for ex in ["dflash2", "mtp"]:
        for ctx in [None, 65536]:
            key = f"{ex}-{ctx or 'min'}"
            if want is not None and key not in want:
                continue
            runs = [spec(ex, ctx, th) for _ in range(rep)]
            plain, sp = med([r[0] for r in runs]), med([r[1] for r in runs])
            spec_rows.append((ex, ctx or "minimal", f"{plain:.1f}", f"{sp:.1f}", f"{sp / plain:.2f}x"))
            print(f"{key:<34} plain {plain:.1f} tokens/s, speculative {sp:.1f}: {sp / plain:.2f}x", flush=True)
    if a.write:
        cpu = platform.processor() or "?"
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        except (OSError, StopIteration):
            pass
        # Hand-written notes below the marker survive a rewrite.
        notes = ""
        try:
            with open(a.write) as f:
                text = f.read()
            if NOTES in text:
                notes = text[text.index(NOTES):]
        except OSError:
            pass
        with open(a.write, "w") as f:
            f.write("# Benchmarks\n\n")
            f.write(f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}.\n")
            f.write(f"Command: `cargo build --release --examples && .venv/bin/python scripts/bench-vs-llama.py "
                    f"--threads {th} --repeat {rep} --write {a.write}` (median of {rep} alternating runs per side; "
                    f"{ng} decoded tokens per run; the same generated GGUF, `{os.path.basename(MODEL)}`, "
                    f"F16 KV cache, flash attention, {th} threads unless the row says otherwise).\n\n")
            f.write("| row | shardgraph tokens/s | llama.cpp tokens/s | ratio |\n| --- | --- | --- | --- |\n")
            for _, what, m, t, r in rows:
                f.write(f"| {what} | {m} | {t} | {r} |\n")
            if spec_rows:
                f.write("\nSpeculative decoding (shardgraph's examples, 1 device, 96 tokens; plain greedy vs speculative):\n\n")
                f.write("| example | --ctx-size | plain tokens/s | speculative tokens/s | speed-up |\n| --- | --- | --- | --- | --- |\n")
                for ex, ctx, p, s, r in spec_rows:
                    f.write(f"| {ex} | {ctx} | {p} | {s} | {r} |\n")
            if notes:
                f.write("\n" + notes)
        print(f"wrote {a.write}")


if __name__ == "__main__":
    main()
