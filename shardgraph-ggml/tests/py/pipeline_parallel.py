"""llama.cpp's pipeline parallelism with SG listed twice.

Usage: pipeline_parallel.py MODEL LIB  (one SG device: SHARDGRAPH_DEVICES unset)

llama.cpp turns pipeline parallelism on (the scheduler's parallel mode: 4
copies of every input, events between the devices) only over several
non-CPU devices that all report asynchronous copies and events, with
--split-mode layer. With the devices [SG, SG] the model's layers are split
between two SG backends; the prompt and 16 greedy steps are compared with
llama.cpp's CPU backend. Prints one JSON line: whether llama.cpp logged
"pipeline parallelism enabled", the worst logits NMSE and whether the
greedy tokens are equal.
"""
import ctypes
import json
import sys

import llama_cpp as L

import sg as sg_lib

model_path, lib = sys.argv[1], sys.argv[2]
lines = sg_lib.lines
sg = sg_lib.load(lib)
PROMPT, STEPS = [11, 205, 3, 99, 42, 310, 7, 64], 16


def run(devices):
    mp = L.llama_model_default_params()
    keep_devices = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
    mp.n_gpu_layers, mp.devices = (999 if devices else 0), ctypes.cast(keep_devices, ctypes.c_void_p)
    mp.split_mode = L.LLAMA_SPLIT_MODE_LAYER
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    assert model, "model"
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_threads, p.n_threads_batch = 256, 16, 16, 2, 2
    c = L.llama_init_from_model(model, p)
    assert c, "context"
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    b = L.llama_batch_init(len(PROMPT), 0, 1)

    def decode(ids, start):
        for i, t in enumerate(ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, i == len(ids) - 1
            b.seq_id[i][0] = 0
        b.n_tokens = len(ids)
        assert L.llama_decode(c, b) == 0, "llama_decode"
        return list(ctypes.cast(L.llama_get_logits_ith(c, -1), ctypes.POINTER(ctypes.c_float))[:n_vocab])

    rows, tokens = [decode(PROMPT, 0)], []
    for k in range(STEPS):
        tokens.append(max(range(n_vocab), key=lambda i: rows[-1][i]))
        rows.append(decode([tokens[-1]], len(PROMPT) + k))
    L.llama_batch_free(b)
    L.llama_free(c)
    L.llama_model_free(model)
    return rows, tokens


def nmse(x, y):
    return sum((a - b) ** 2 for a, b in zip(x, y)) / max(1e-30, sum(b * b for b in y))


cpu = run([])
first = len(lines)
two = run([sg, sg])
print(json.dumps({
    "pipeline_parallel": any("pipeline parallelism enabled" in l for l in lines[first:]),
    "max_nmse": max(nmse(s, c) for s, c in zip(two[0], cpu[0])),
    "tokens_equal": two[1] == cpu[1],
}), flush=True)
