//! The examples' option parser against bad values: each case must exit
//! with status 2 and a message that echoes the option and its value, before
//! any model is generated or loaded (`cargo test` builds the examples next
//! to the test binaries; run alone with `--test examples_cli` they may be
//! missing, and the test says so and fails). And the examples on real
//! files written to a temp folder: `decode --verify` on a tiny model (its
//! tokens equal one CPU device's), with a prompt of token ids, K and V
//! cache types apart, `--fit on` with a 300-token prompt, a `qwen35` file;
//! `dflash2 --model T --model-draft D` and `mtp --model` with prompts from
//! a file and the command line; a wrong drafter, a file of a tensor type no
//! kernel runs and MTP asked of a `qwen3` refused before any decoding.

#[path = "common/qwen35_tiny.rs"]
mod qwen35_tiny;

use std::path::PathBuf;
use std::process::Command;

/// The built example `name` (`target/<profile>/examples/<name>`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap().join("examples");
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is not built: run `cargo test` (which builds the examples) or `cargo build --examples`",
        p.display()
    );
    p
}

#[test]
fn bad_options_exit_with_the_value_in_the_message() {
    let nope = std::env::temp_dir().join(format!("shardgraph-nope-{}.gguf", std::process::id()));
    let nope_s = nope.to_str().unwrap().to_string();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("dflash2", vec!["--tensor-split", "0,0"], "--tensor-split needs non-negative numbers, not all zero"),
        ("dflash2", vec!["--tensor-split", "1,nan"], "--tensor-split 1,nan: \"nan\" is not a finite number"),
        ("dflash2", vec!["--tensor-split", "1,x"], "--tensor-split 1,x: \"x\" is not a finite number"),
        ("dflash2", vec!["--tensor-split", "1,,1"], "--tensor-split 1,,1: \"\" is not a finite number"),
        ("mtp", vec!["--tensor-split", "1e40,1"], "\"1e40\" is not a finite number"),
        ("dflash2", vec!["--spec-draft-n-max", "257"], "--spec-draft-n-max 257: must be within 1..=256"),
        ("dflash2", vec!["--devices", "65"], "--devices 65: 1 to 64"),
        ("dflash2", vec!["--devices", "1000"], "--devices 1000: 1 to 64"),
        ("dflash2", vec!["--devices", "2", "--tensor-split", "1,1,1"], "3 ratio(s) for 2 device(s)"),
        ("dflash2", vec!["--n-predict", "0"], "--n-predict 0"),
        ("dflash2", vec!["--threads", "0"], "--threads 0"),
        ("decode", vec!["--n-predict", "0"], "--n-predict 0: must be at least 1"),
        ("decode", vec!["--ubatch-size", "0"], "--ubatch-size 0: must be at least 1"),
        ("dflash2", vec!["--prompt-tokens", "1,,2"], "--prompt-tokens 1,,2: an empty entry between commas"),
        ("mtp", vec!["--prompt-tokens", ",1"], "--prompt-tokens ,1: an empty entry between commas"),
        ("dflash2", vec!["--target", "llama"], "--target llama"),
        ("mtp", vec!["--spec-draft-n-max", "1000000"], "--spec-draft-n-max 1000000: must be within 1..=256"),
        ("mtp", vec!["--spec-draft-n-max", "100000000"], "--spec-draft-n-max 100000000"),
        ("mtp", vec!["--n-predict", "18446744073709551615"], "--n-predict 18446744073709551615"),
        ("mtp", vec!["--n-predict", "18446744073709551616"], "--n-predict 18446744073709551616: not a valid value"),
        ("mtp", vec!["--spec-draft-p-min", "2"], "--spec-draft-p-min 2"),
        ("decode", vec!["--devices", "abc"], "--devices abc: not a valid value"),
        ("decode", vec!["--bogus", "1"], "unknown option or missing value: --bogus"),
        ("decode", vec!["--threads"], "unknown option or missing value: --threads"),
        ("decode", vec!["--model", &nope_s], "not a file"),
        ("decode", vec!["--ctx-size", "-5"], "--ctx-size -5"),
        (
            "decode",
            vec!["--n-prompt", "18446744073709551615", "--n-predict", "2"],
            "no context can hold 18446744073709551615",
        ),
        ("decode", vec!["--split-mode", "row"], "--split-mode row"),
        ("decode", vec!["--split-mode", "none", "--devices", "0"], "--devices 0: 1 to 64"),
        ("decode", vec!["--fit", "maybe"], "--fit maybe: use on or off"),
        ("mtp", vec!["--fit", "1"], "--fit 1: use on or off"),
        ("mtp", vec!["--fit", "on", "--ctx-size", "1"], "--ctx-size 1 is too small"),
        ("decode", vec!["--fit", "on", "--ctx-size", "-5"], "--ctx-size -5 is too small"),
        ("dflash2", vec!["--devices", "2", "--devices", "3"], "--devices is given more than once"),
        ("dflash2", vec!["--ctx-size", "99999999999999"], "--ctx-size 99999999999999 is too large"),
        ("dflash2", vec!["--n-predict", "2147483647"], "this run needs 2147483663 cells"),
        ("mtp", vec!["--ctx-size", "2147483648"], "--ctx-size 2147483648 is too large"),
        (
            "dflash2",
            vec!["--device", "HIP"],
            "--device HIP: device \"HIP\": use CPU, CUDA<i>, HIP<i> (i: 1 to 9 decimal digits), EMU or EMUHIP",
        ),
        ("dflash2", vec!["--device", "CPU,HIP+0"], "device \"HIP+0\": use CPU"),
        ("mtp", vec!["--device", "hip-1,hip-1"], "device \"hip-1\": use CPU"),
        ("mtp", vec!["--device", "HIP1234567890"], "device \"HIP1234567890\": use CPU"),
        ("mtp", vec!["--device", "CPU,CPU", "--devices", "3"], "--device names 2 device(s) but --devices is 3"),
        // Sampling options (llama.cpp's --temp, --top-k, --top-p, --min-p, --seed).
        ("dflash2", vec!["--temp", "nan"], "--temp NaN: must be a finite number"),
        ("mtp", vec!["--temp", "inf"], "--temp inf: must be a finite number"),
        ("mtp", vec!["--temp", "warm"], "--temp warm: not a valid value"),
        ("dflash2", vec!["--top-k", "-1"], "--top-k -1: not a valid value"),
        ("mtp", vec!["--top-p", "0"], "--top-p 0: must be within (0, 1]"),
        ("mtp", vec!["--top-p", "1.5"], "--top-p 1.5: must be within (0, 1]"),
        ("dflash2", vec!["--min-p", "-0.1"], "--min-p -0.1: must be within [0, 1]"),
        ("mtp", vec!["--min-p", "2"], "--min-p 2: must be within [0, 1]"),
        // -1 is llama.cpp's spelling of its default seed; other negatives are typos.
        ("mtp", vec!["--seed", "-2"], "--seed -2: not a valid value"),
        ("dflash2", vec!["--seed", "18446744073709551616"], "--seed 18446744073709551616: not a valid value"),
        ("mtp", vec!["--seed", "4294967296"], "--seed 4294967296: not a valid value"),
        ("dflash2", vec!["--temp", "0.8", "--verify"], "--verify needs --temp 0 (greedy), given --temp 0.8"),
        ("mtp", vec!["--verify", "--temp", "1"], "--verify needs --temp 0 (greedy), given --temp 1"),
        (
            "decode",
            vec!["--tensor-split", "1,1", "--n-predict", "2", "--tensor-split", "1,1,1"],
            "--tensor-split is given more than once",
        ),
        // K and V cache types (llama.cpp's list) and prompts as token ids.
        ("decode", vec!["--cache-type-v", "q4_K"], "--cache-type-v q4_K: llama.cpp's cache types are f32, f16"),
        ("mtp", vec!["--cache-type-k", "q9"], "--cache-type-k q9: llama.cpp's cache types are"),
        ("dflash2", vec!["--cache-type-k", "f16", "--cache-type-v", "int8"], "--cache-type-v int8"),
        ("dflash2", vec!["--prompt-tokens", "1,x"], "--prompt-tokens 1,x: \"x\" is not a token id"),
        ("decode", vec!["--prompt-tokens", "3,-1"], "--prompt-tokens 3,-1: \"-1\" is not a token id"),
        ("mtp", vec!["--prompt-tokens", ","], "--prompt-tokens ,: an empty entry between commas"),
        ("mtp", vec!["--prompt-tokens", "1", "--prompt-tokens-file", "x"], "give one of them"),
        ("decode", vec!["--prompt-tokens-file", &nope_s], "--prompt-tokens-file"),
    ];
    for (ex, args, want) in cases {
        let out = Command::new(example(ex)).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let what = format!("{ex} {}", args.join(" "));
        assert_eq!(out.status.code(), Some(2), "{what}: exit status {:?}, stderr {err}", out.status);
        assert!(err.contains(want), "{what}: stderr should contain {want:?}: {err}");
        assert!(err.len() < 400, "{what}: a long message ({} bytes): {err}", err.len());
        assert!(!err.contains("regenerate") && !err.contains("panicked"), "{what}: {err}");
        assert!(out.stdout.is_empty(), "{what}: printed before refusing: {}", String::from_utf8_lossy(&out.stdout));
    }
    assert!(!nope.exists(), "--model wrote {}", nope.display());
}

/// `decode --verify` on two devices compares its greedy tokens with a run of
/// the same file on one CPU device and says they are identical (exit 0).
#[test]
fn decode_verify_compares_with_one_device() {
    use shardgraph::GgmlType;
    use shardgraph_models::generate::write_qwen3_gguf;
    use shardgraph_models::hparams::HparamsCore;
    use shardgraph_models::qwen3::Qwen3Hparams;
    use shardgraph_models::types::TensorTypes;
    let dir = std::env::temp_dir().join(format!("shardgraph-decode-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny.gguf");
    let hp = Qwen3Hparams { core: HparamsCore::qwen3(2, 64, 128, 6, 3, 32), n_vocab: 96, n_ctx_train: 4096 };
    write_qwen3_gguf(&model, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 3).unwrap();
    let args = ["--model", model.to_str().unwrap(), "--devices", "2", "--n-prompt", "5", "--n-predict", "6"];
    let out = Command::new(example("decode")).args(args).args(["--ctx-size", "256", "--verify"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout {stdout}, stderr {stderr}");
    assert!(stdout.contains("verify: identical — 7 greedy tokens"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[path = "common/gguf_edit.rs"]
mod gguf_edit;

/// Runs example `name` with `args`: its exit status, stdout, stderr and seconds.
fn run(name: &str, args: &[&str]) -> (Option<i32>, String, String, f64) {
    let t = std::time::Instant::now();
    let out = Command::new(example(name)).args(args).output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    (out.status.code(), o, e, t.elapsed().as_secs_f64())
}

/// The examples on real files (generated into a temp folder): prompts as
/// token ids (`--prompt-tokens`, `--prompt-tokens-file`), K and V caches
/// of different types, `--fit on` with a prompt batch over 256 tokens, a
/// `qwen35` model in `decode`, `dflash2 --model T --model-draft D` and
/// `mtp --model` checked against one device; and refusals before any
/// decoding — a drafter whose tensors do not fit its target (no plain
/// baseline runs first: timed), a tensor of a type no kernel runs (named
/// with its type), MTP asked of a `qwen3`.
#[test]
fn examples_take_real_files_and_token_prompts() {
    use shardgraph::gguf::MetaValue;
    use shardgraph::GgmlType;
    use shardgraph_models::generate::{write_example_pair, write_qwen35_gguf_with, write_qwen3_gguf, Weights};
    use shardgraph_models::hparams::HparamsCore;
    use shardgraph_models::qwen3::Qwen3Hparams;
    use shardgraph_models::qwen35::Qwen35Hparams;
    use shardgraph_models::types::TensorTypes;
    let dir = std::env::temp_dir().join(format!("shardgraph-examples-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let tiny = p("tiny.gguf");
    let hp = Qwen3Hparams { core: HparamsCore::qwen3(2, 64, 128, 6, 3, 32), n_vocab: 96, n_ctx_train: 4096 };
    write_qwen3_gguf(&tiny, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 3).unwrap();
    let (target, drafter) = write_example_pair(&dir).unwrap();
    let (target, drafter) = (target.to_str().unwrap().to_string(), drafter.to_str().unwrap().to_string());
    let q35 = p("qwen35-mtp.gguf");
    let h35 = Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    write_qwen35_gguf_with(&q35, &h35, &TensorTypes::uniform(GgmlType::Q8_0), 7, Weights::Permutation).unwrap();
    let prompt_file = p("prompt.txt");
    std::fs::write(&prompt_file, "5, 6, 7\n100 200\n").unwrap();

    // decode: token ids, K q8_0 / V f16, 2 devices, checked against one.
    let args = ["--model", &tiny, "--devices", "2", "--prompt-tokens", "5,6,7,8", "--n-predict", "6"];
    let (code, out, err, _) = run(
        "decode",
        &[&args[..], &["--ctx-size", "256", "--cache-type-k", "q8_0", "--cache-type-v", "f16", "--verify"]].concat(),
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("KV cache K q8_0, V f16: prompt 4 tokens"), "{out}");
    assert!(out.contains("verify: identical — 7 greedy tokens"), "{out}");
    // decode --fit on with a 300-token prompt (a batch over 256 cells).
    let (code, out, err, _) =
        run("decode", &["--model", &tiny, "--fit", "on", "--n-prompt", "300", "--n-predict", "2"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("--fit on: ctx-size") && out.contains("prompt 300 tokens"), "{out}");
    // decode on a qwen35 file (its MTP layer unused), 3 devices.
    let (code, out, err, _) =
        run("decode", &["--model", &q35, "--devices", "3", "--prompt-tokens", "1,2,3", "--n-predict", "4", "--verify"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("qwen35 3 device(s)") && out.contains("verify: identical"), "{out}");

    // dflash2 with the example pair given as files and a prompt file.
    let (code, out, err, _) = run(
        "dflash2",
        &["--model", &target, "--model-draft", &drafter, "--prompt-tokens-file", &prompt_file, "--n-predict", "8"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("prompt 5 tokens, 8 generated"), "{out}");
    // mtp on the qwen35 file, prompt ids, K q4_0 / V q8_0, checked against one device.
    let args = [
        "--model",
        &q35,
        "--prompt-tokens",
        "9,8,7",
        "--n-predict",
        "6",
        "--cache-type-k",
        "q4_0",
        "--cache-type-v",
        "q8_0",
    ];
    let (code, out, err, _) = run("mtp", &[&args[..], &["--devices", "2", "--verify"]].concat());
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("KV cache K q4_0, V q8_0") && out.contains("verify: identical"), "{out}");

    // A drafter whose tensors do not fit the target (its FFN width
    // rewritten in the metadata): refused before the plain baseline.
    let wrong = p("dflash2-wrong.gguf");
    gguf_edit::copy_with(
        std::path::Path::new(&drafter),
        std::path::Path::new(&wrong),
        &[("dflash.feed_forward_length", MetaValue::from(1024u32))],
        &[],
    );
    let (code, out, err, secs) = run("dflash2", &["--model", &target, "--model-draft", &wrong, "--n-predict", "64"]);
    println!("a wrong drafter refused in {secs:.2} s: {err}");
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("dflash drafter") && err.contains("wrong type or shape"), "{err}");
    assert!(!out.contains("plain") && !out.contains("tokens/s"), "decoded before refusing: {out}");
    // A tensor of a type no kernel runs, named with its type.
    let f32_model = p("tiny-f32.gguf");
    write_qwen3_gguf(&f32_model, &hp, &TensorTypes::uniform(GgmlType::F32), 3).unwrap();
    let bad = p("tiny-i32.gguf");
    gguf_edit::copy_with(
        std::path::Path::new(&f32_model),
        std::path::Path::new(&bad),
        &[],
        &[("blk.1.ffn_up.weight", GgmlType::I32)],
    );
    let (code, out, err, _) = run("decode", &["--model", &bad, "--n-predict", "2"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("blk.1.ffn_up.weight is i32"), "{err}");
    // MTP asked of a qwen3 file, and a file of another architecture: refused.
    let (code, out, err, _) = run("mtp", &["--model", &tiny, "--n-predict", "4"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("MTP") && err.contains("qwen3") && !out.contains("plain"), "{out}{err}");
    let (code, _, err, _) = run("decode", &["--model", &drafter, "--n-predict", "2"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("\"dflash\"") && err.contains("qwen3 or qwen35"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
