//! Lists the CUDA kernel sources (`kernels-cuda/*.cu`) for the `cuda`
//! feature, so every file in the folder is embedded and compile-checked
//! without a hand-kept list.

use std::io::Write;

fn main() {
    println!("cargo:rerun-if-changed=kernels-cuda");
    println!("cargo:rerun-if-changed=build.rs");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("kernels-cuda");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "cu")).collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut f = std::fs::File::create(out.join("cuda_kernels.rs")).expect("create cuda_kernels.rs");
    writeln!(f, "&[").expect("write");
    for p in &files {
        let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("?");
        println!("cargo:rerun-if-changed={}", p.display());
        writeln!(f, "    ({name:?}, include_str!({:?})),", p.display().to_string()).expect("write");
    }
    writeln!(f, "]").expect("write");
}
