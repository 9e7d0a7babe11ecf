"""llama.cpp's sequence state saved and restored with every layer on SG.

Usage: state_roundtrip.py MODEL LIB  (SHARDGRAPH_DEVICES as the caller sets it)

On llama.cpp's CPU backend and then on SG: decode a prompt, save the
sequence state (llama_state_seq_get_data), decode other tokens, drop the
sequence, restore the state and decode one token; also load the saved
state into a new context and decode the same token; decode the prompt in
a context A, make a second context, decode in it and free it, then decode
the token in A (freeing one context must not touch another's caches); and
decode prompt + token in a fresh context; and, in contexts of 1 and 3
sequence slots (the 3 with 2 rollback snapshots each), decode other tokens in the last slot's sequence, drop it
(llama_memory_seq_rm) and decode prompt + token in it again (a recurrent
cell reused: llama.cpp zeroes its state in the graph), against a fresh
context of as many slots. Prints one JSON line per backend with the NMSE
of the restored, the moved, A's and the reused logits against the fresh
ones, and a last line with SG's fresh logits against the CPU backend's.
"""
import ctypes
import json
import sys

import llama_cpp as L

import sg as sg_lib

model_path, lib = sys.argv[1], sys.argv[2]
sg = sg_lib.load(lib)
PROMPT, OTHER, NEXT = [11, 205, 3, 99, 42, 310, 7, 64], [5, 6, 7, 8], [27]


def context(model, seqs=1, rs=0):
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_threads, p.n_threads_batch = 256, 16, 16, 2, 2
    p.n_seq_max, p.n_rs_seq = seqs, rs
    c = L.llama_init_from_model(model, p)
    assert c, "context"
    return c


def decode(c, model, ids, start, seq=0):
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    b = L.llama_batch_init(len(ids), 0, 1)
    for i, t in enumerate(ids):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, i == len(ids) - 1
        b.seq_id[i][0] = seq
    b.n_tokens = len(ids)
    rc = L.llama_decode(c, b)
    L.llama_batch_free(b)
    assert rc == 0, f"llama_decode: {rc}"
    return list(ctypes.cast(L.llama_get_logits_ith(c, -1), ctypes.POINTER(ctypes.c_float))[:n_vocab])


def nmse(x, y):
    return sum((a - b) ** 2 for a, b in zip(x, y)) / max(1e-30, sum(b * b for b in y))


fresh = {}
for name, dev in (("CPU", None), ("SG", sg)):
    mp = L.llama_model_default_params()
    devices = (ctypes.c_void_p * 2)(dev, None) if dev else (ctypes.c_void_p * 1)(None)
    mp.n_gpu_layers, mp.devices = (999 if dev else 0), ctypes.cast(devices, ctypes.c_void_p)
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    assert model, "model"
    c = context(model)
    decode(c, model, PROMPT, 0)
    n = L.llama_state_seq_get_size(c, 0)
    saved = (ctypes.c_uint8 * n)()
    assert L.llama_state_seq_get_data(c, saved, n, 0) == n
    decode(c, model, OTHER, len(PROMPT))
    L.llama_memory_seq_rm(L.llama_get_memory(c), 0, -1, -1)
    assert L.llama_state_seq_set_data(c, saved, n, 0) == n
    restored = decode(c, model, NEXT, len(PROMPT))
    L.llama_free(c)
    c = context(model)
    assert L.llama_state_seq_set_data(c, saved, n, 0) == n
    moved = decode(c, model, NEXT, len(PROMPT))
    L.llama_free(c)
    a = context(model)
    decode(a, model, PROMPT, 0)
    b = context(model)
    decode(b, model, OTHER, 0)
    L.llama_free(b)
    after_other = decode(a, model, NEXT, len(PROMPT))
    L.llama_free(a)
    c = context(model)
    decode(c, model, PROMPT, 0)
    fresh[name] = decode(c, model, NEXT, len(PROMPT))
    L.llama_free(c)
    reused = {}
    # 3 slots with 2 rollback snapshots each (llama.cpp's n_rs_seq, which
    # its speculative decoding sets): the snapshot planes are strided views.
    for seqs, rs in ((1, 0), (3, 2)):
        s = seqs - 1
        c = context(model, seqs, rs)
        decode(c, model, OTHER, 0, s)
        decode(c, model, NEXT, len(OTHER), s)
        assert L.llama_memory_seq_rm(L.llama_get_memory(c), s, -1, -1)
        decode(c, model, PROMPT, 0, s)
        got = decode(c, model, NEXT, len(PROMPT), s)
        L.llama_free(c)
        c = context(model, seqs, rs)
        decode(c, model, PROMPT, 0, s)
        reused[f"reused_{seqs}_slots_nmse"] = nmse(got, decode(c, model, NEXT, len(PROMPT), s))
        L.llama_free(c)
    L.llama_model_free(model)
    print(json.dumps({"backend": name, "state_bytes": n, "restored_nmse": nmse(restored, fresh[name]),
                      "moved_nmse": nmse(moved, fresh[name]),
                      "other_freed_nmse": nmse(after_other, fresh[name]), **reused}), flush=True)
print(json.dumps({"sg_vs_cpu_nmse": nmse(fresh["SG"], fresh["CPU"])}), flush=True)
