//! Writes the `model_load` seed corpus: the three base files of
//! `hostile::bases()` (a tiny qwen3, a tiny qwen35 with its MTP layer, a
//! DFlash2 drafter for the qwen3) into `fuzz/corpus/model_load/` (or the
//! folder given as the first argument).
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example seeds`

#[path = "../../tests/common/hostile.rs"]
mod hostile;

fn main() {
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/model_load"));
    std::fs::create_dir_all(&dir).unwrap();
    for b in hostile::bases() {
        let p = dir.join(format!("{}.gguf", b.arch));
        std::fs::write(&p, &b.bytes).unwrap();
        println!("{} ({} bytes)", p.display(), b.bytes.len());
    }
}
