#!/usr/bin/env python3
"""Our drafters against llama.cpp's, step by step (a manual check, not a cargo test).

Builds llama.cpp's `llama-speculative-simple` once from its source (the
llama.cpp that llama-cpp-python's source distribution bundles) with
`scripts/llama-spec-simple.patch` applied (the prompt as token ids, one line
per step: drafts, accepted count, tokens; no end-of-generation check), cached
under ~/.cache/shardgraph/llama-tools (`$SHARDGRAPH_LLAMA_TOOLS`; rebuilt when the
source path or the patch changes). Then,
greedily and with the same prompt ids and draft length, it runs llama.cpp and
our `spec_trace` example on the examples' generated files:

  dflash2      the dflash2 example's qwen3 target and DFlash2 drafter
               (--spec-type draft-dflash -md D, 7 drafts per step)
  mtp          the mtp example's qwen35 file with its MTP layer
               (--spec-type draft-mtp, 3 drafts per step)

and prints one line per pair, e.g.
  dflash2: 64 tokens, 9 steps, drafts equal 9/9, accepted equal 9/9, tokens equal

Our loop decodes the whole prompt before its first step; llama.cpp's decodes
all but the prompt's last token and drafts after it. llama.cpp is therefore
given the prompt followed by our first generated token: its steps are then
ours, position for position. (A second llama.cpp run on the bare prompt
checks that first token: its generated tokens must equal ours.)

Usage: scripts/llama-spec-compare.py [--llama-src DIR] [--n-predict 64]
       [--pairs dflash2,mtp] [--threads 2] [--build-only]
Needs: cargo build --release --examples (it runs target/release/examples/*);
cmake and ninja (from PATH, else pip-installed into the cache's venv); a
C++ compiler. The build takes about 4 minutes on 2 free cores.
Exit status 0 when every pair is equal, 1 otherwise.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "scripts" / "llama-spec-simple.patch"
DEFAULT_SRC = [
    os.environ.get("LLAMA_CPP_SRC", ""),
    str(Path.home() / ".cache" / "shardgraph" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"),
    "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp",
]
CACHE = Path(os.environ.get("SHARDGRAPH_LLAMA_TOOLS", Path.home() / ".cache" / "shardgraph" / "llama-tools"))
TMP = Path(tempfile.gettempdir())


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def tools_path():
    """cmake and ninja: from PATH, else a venv in the cache with pip's wheels."""
    if shutil.which("cmake") and shutil.which("ninja"):
        return os.environ["PATH"]
    venv = CACHE / "venv"
    if not (venv / "bin" / "cmake").exists():
        run([sys.executable, "-m", "venv", venv])
        run([venv / "bin" / "pip", "install", "-q", "cmake", "ninja"])
    return f"{venv / 'bin'}:{os.environ['PATH']}"


def build(src: Path) -> Path:
    """The patched llama-speculative-simple, built once per source and patch
    (the cache's `spec-simple.key` names the pair its `src/` and `build/` hold)."""
    # GGML_NATIVE: a build is for this CPU's flags as well.
    flags = next((l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")), "")
    key = hashlib.sha256(str(src.resolve()).encode() + PATCH.read_bytes() + flags.encode()).hexdigest()[:16]
    stamp = CACHE / "spec-simple.key"
    exe = CACHE / "build" / "bin" / "llama-speculative-simple"
    if exe.exists() and stamp.exists() and stamp.read_text().strip() == key:
        return exe
    for d in ("src", "build"):
        shutil.rmtree(CACHE / d, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    run(["cp", "-a", src, CACHE / "src"])
    run(["patch", "-p1", "-i", PATCH], cwd=CACHE / "src")
    env = dict(os.environ, PATH=tools_path())
    nice = ["nice", "-n", "5"]
    run(nice + ["cmake", "-S", CACHE / "src", "-B", CACHE / "build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_SERVER=OFF"], env=env, stdout=subprocess.DEVNULL)
    run(nice + ["ninja", "-C", CACHE / "build", "llama-speculative-simple"], env=env, stdout=subprocess.DEVNULL)
    stamp.write_text(key + "\n")
    return exe


def example(name):
    p = ROOT / "target" / "release" / "examples" / name
    if not p.exists():
        sys.exit(f"{p} is missing: run cargo build --release --examples")
    return p


def ensure_files():
    """The examples write their models into the temp folder when absent (or stale)."""
    run([example("dflash2"), "--devices", "1", "--n-predict", "1"], stdout=subprocess.DEVNULL)
    run([example("mtp"), "--devices", "1", "--n-predict", "1"], stdout=subprocess.DEVNULL)
    return {
        "dflash2": (TMP / "shardgraph-example-qwen3-q4_k_m.gguf", TMP / "shardgraph-example-dflash2-q8_0.gguf", 7),
        "mtp": (TMP / "shardgraph-example-qwen35-q8_0.gguf", None, 3),
    }


def parse(text):
    """(steps, generated): steps as (pos, last, drafts, accepted, tokens)."""
    steps, generated = [], None
    ids = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    for line in text.splitlines():
        w = line.split()
        if len(w) == 12 and w[0] == "step":
            # step i pos P last L draft|reused D accepted K tokens T
            steps.append((int(w[3]), int(w[5]), w[6], ids(w[7]), int(w[9]), ids(w[11])))
        elif len(w) == 11 and w[0] == "step":  # an empty draft list
            steps.append((int(w[3]), int(w[5]), w[6], [], int(w[8]), ids(w[10])))
        elif w[:1] == ["generated"]:
            generated = ids(w[1]) if len(w) > 1 else []
    return steps, generated


def ours(target, draft, prompt, n, n_max, threads):
    cmd = [example("spec_trace"), "--model", target, "--prompt-tokens", ",".join(map(str, prompt)),
           "--n-predict", n, "--spec-draft-n-max", n_max, "--threads", threads]
    if draft:
        cmd += ["--model-draft", draft]
    out = run(cmd, capture_output=True, text=True).stdout
    return parse(out)


def llama(exe, target, draft, prompt, n, n_max, threads):
    cmd = [exe, "-m", target, "-p", ",".join(map(str, prompt)), "-n", n, "--temp", "0", "-t", threads,
           "-c", len(prompt) + n + 64, "--spec-draft-n-max", n_max, "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0"]
    cmd += ["--spec-type", "draft-dflash", "-md", draft] if draft else ["--spec-type", "draft-mtp"]
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        raise RuntimeError(f"llama-speculative-simple exited with {p.returncode}")
    steps, _ = parse(p.stdout)
    return steps


def compare(name, exe, target, draft, n_max, prompt, n, threads):
    our_steps, generated = ours(target, draft, prompt, n, n_max, threads)
    # llama.cpp from our first token on (see the module doc).
    theirs = llama(exe, target, draft, prompt + generated[:1], n, n_max, threads)
    # And from the bare prompt: the same tokens.
    bare = llama(exe, target, draft, prompt, n, n_max, threads)
    bare_tokens = [t for s in bare for t in s[5]][:n]
    drafted = [s for s in theirs if s[2] == "draft"]
    reused = len(theirs) - len(drafted)
    k = len(our_steps)
    d_eq = sum(1 for a, b in zip(our_steps, drafted) if (a[0], a[1], a[3]) == (b[0], b[1], b[3]))
    a_eq = sum(1 for a, b in zip(our_steps, drafted) if a[4] == b[4] and a[5] == b[5])
    tok_eq = bare_tokens == generated
    for i, (a, b) in enumerate(zip(our_steps, drafted)):
        if a != b:
            print(f"  {name} step {i}: ours pos {a[0]} last {a[1]} draft {a[3]} accepted {a[4]}; "
                  f"llama.cpp pos {b[0]} last {b[1]} draft {b[3]} accepted {b[4]}", file=sys.stderr)
            break
    if not tok_eq:
        print(f"  {name}: ours {generated}\n  {name}: llama.cpp {bare_tokens}", file=sys.stderr)
    extra = f", {reused} llama.cpp steps re-verifying a checkpoint" if reused else ""
    print(f"{name}: {len(generated)} tokens, {k} steps, drafts equal {d_eq}/{k}, accepted equal {a_eq}/{k}, "
          f"tokens {'equal' if tok_eq else 'DIFFER'}{extra}", flush=True)
    return d_eq == k and a_eq == k and tok_eq and len(drafted) >= k


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-src", help="llama.cpp's source tree (default: $LLAMA_CPP_SRC or the set-up's)")
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", default="dflash2,mtp")
    ap.add_argument("--prompt-tokens", default="11,400,789,1178,1567,1956,2345,2734")
    ap.add_argument("--build-only", action="store_true",
                    help="build (or find cached) llama-speculative-simple, print its path and stop")
    a = ap.parse_args()
    src = next((Path(s) for s in [a.llama_src or ""] + DEFAULT_SRC if s and Path(s, "CMakeLists.txt").exists()),
               None)
    if src is None:
        sys.exit("llama.cpp's source not found: give --llama-src or LLAMA_CPP_SRC")
    exe = build(src)
    if a.build_only:
        print(exe)
        return
    files = ensure_files()
    prompt = [int(t) for t in a.prompt_tokens.split(",")]
    ok = True
    for name in a.pairs.split(","):
        target, draft, n_max = files[name]
        ok &= compare(name, exe, target, draft, n_max, prompt, a.n_predict, a.threads)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
