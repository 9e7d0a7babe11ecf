//! AMDGPU code objects: the kernels in what `hipcc --genco` writes (a clang
//! offload bundle holding one ELF per GPU target) or in what hipRTC returns
//! (one raw AMDGPU ELF).
//!
//! A kernel is found by its kernel descriptor, the ELF symbol `<name>.kd`
//! (64 bytes the GPU's command processor reads to start the kernel: see
//! LLVM's *AMDGPUUsage*, "Kernel Descriptor"). From the descriptor this
//! module also reads the wave size the kernel was compiled for (bit 458,
//! `ENABLE_WAVEFRONT_SIZE32`, which only gfx10 and later set), so a
//! caller can check it against the `SG_WARP` the kernels assume.
//!
//! The input comes from files and from a compiler, so every read is
//! bounds-checked: truncated or malformed input is an
//! [`Error::Hip`] naming what was wrong and where, never a panic.
//!
//! Formats (all little-endian):
//! - offload bundle: the 24-byte magic `__CLANG_OFFLOAD_BUNDLE__`, a u64
//!   entry count, then per entry a u64 offset (from the start of the
//!   file), a u64 size and a u64 length followed by that many bytes of
//!   target triple (`host-x86_64-unknown-linux-gnu`,
//!   `hipv4-amdgcn-amd-amdhsa--gfx90a`). Host entries are skipped.
//! - ELF64 (`e_machine` = `EM_AMDGPU`, 224): the section headers, each
//!   symbol table (`SHT_SYMTAB`, `SHT_DYNSYM`) with its linked string
//!   table, and the section holding each descriptor.
//!
//! Compressed bundles (magic `CCOB`, `hipcc --offload-compress`) are
//! reported as such, not decoded.

use crate::error::{Error, Result};

/// The magic at the start of a clang offload bundle.
pub const BUNDLE_MAGIC: &[u8; 24] = b"__CLANG_OFFLOAD_BUNDLE__";
/// The magic at the start of a compressed clang offload bundle.
const COMPRESSED_MAGIC: &[u8; 4] = b"CCOB";
/// `e_machine` of an AMDGPU ELF.
pub const EM_AMDGPU: u16 = 224;
/// Size of a kernel descriptor, bytes.
const DESCRIPTOR_SIZE: usize = 64;

/// One kernel of a code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The kernel's symbol name (the `extern "C"` name in the source).
    pub name: String,
    /// The wave size the kernel runs with, threads: 32 when the descriptor
    /// sets `ENABLE_WAVEFRONT_SIZE32` (gfx10 and later in wave32 mode), else 64.
    pub wave_size: u32,
    /// Bytes of kernel arguments the descriptor declares (`kernarg_size`,
    /// including the runtime's hidden arguments).
    pub kernarg_size: u32,
}

/// The code for one GPU target: a bundle entry, or the whole input when
/// it is a raw ELF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCode {
    /// The bundle entry's target triple (`hipv4-amdgcn-amd-amdhsa--gfx90a`);
    /// empty for a raw ELF.
    pub target: String,
    /// The ELF header's `e_flags` (`EF_AMDGPU_MACH` in the low byte names
    /// the processor; xnack and sramecc settings above it).
    pub e_flags: u32,
    /// The kernels, sorted by name, each once.
    pub kernels: Vec<Kernel>,
}

/// One entry of a clang offload bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleEntry {
    /// The entry's target triple.
    pub triple: String,
    /// Start of the entry's bytes in the bundle.
    pub offset: usize,
    /// Length of the entry's bytes.
    pub size: usize,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Hip { detail: format!("code object: {what}") }
}

/// `len` bytes at `at`, or an error naming `what` (never a panic).
fn bytes<'a>(data: &'a [u8], at: u64, len: u64, what: &str) -> Result<&'a [u8]> {
    let start = usize::try_from(at).map_err(|_| bad(format!("{what}: offset {at} out of range")))?;
    let len = usize::try_from(len).map_err(|_| bad(format!("{what}: length {len} out of range")))?;
    start.checked_add(len).and_then(|end| data.get(start..end)).ok_or_else(|| {
        bad(format!("{what}: bytes {start}..{start}+{len} lie outside the {} bytes of input", data.len()))
    })
}

fn u16_at(data: &[u8], at: u64, what: &str) -> Result<u16> {
    let b = bytes(data, at, 2, what)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

fn u32_at(data: &[u8], at: u64, what: &str) -> Result<u32> {
    let b = bytes(data, at, 4, what)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(data: &[u8], at: u64, what: &str) -> Result<u64> {
    let b = bytes(data, at, 8, what)?;
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    Ok(u64::from_le_bytes(w))
}

/// Whether `data` starts like a clang offload bundle.
pub fn is_bundle(data: &[u8]) -> bool {
    data.starts_with(BUNDLE_MAGIC)
}

/// The entries of a clang offload bundle, each checked to lie inside `data`.
///
/// # Errors
/// [`Error::Hip`] for a missing magic, a compressed bundle, an entry table
/// or entry that leaves the input, or a triple that is not UTF-8.
pub fn bundle_entries(data: &[u8]) -> Result<Vec<BundleEntry>> {
    if data.starts_with(COMPRESSED_MAGIC) {
        return Err(bad("a compressed offload bundle (CCOB); unpack it with clang-offload-bundler first"));
    }
    if !is_bundle(data) {
        return Err(bad("not a clang offload bundle (no __CLANG_OFFLOAD_BUNDLE__ magic)"));
    }
    let mut at = BUNDLE_MAGIC.len() as u64;
    let count = u64_at(data, at, "bundle entry count")?;
    at += 8;
    // Each entry takes at least 24 bytes of table: a count the input cannot
    // hold is malformed (and must not size an allocation).
    if count > (data.len() as u64) / 24 {
        return Err(bad(format!("bundle claims {count} entries in {} bytes", data.len())));
    }
    let mut entries = Vec::with_capacity(count as usize);
    for i in 0..count {
        let what = format!("bundle entry {i}");
        let offset = u64_at(data, at, &what)?;
        let size = u64_at(data, at + 8, &what)?;
        let tlen = u64_at(data, at + 16, &what)?;
        let triple = bytes(data, at + 24, tlen, &format!("{what} triple"))?;
        at = at + 24 + tlen;
        let triple = std::str::from_utf8(triple).map_err(|_| bad(format!("{what}: target triple is not UTF-8")))?;
        bytes(data, offset, size, &format!("{what} ({triple})"))?;
        entries.push(BundleEntry { triple: triple.to_string(), offset: offset as usize, size: size as usize });
    }
    Ok(entries)
}

/// One section header's fields this parser uses.
#[derive(Clone, Copy, Debug)]
struct Section {
    kind: u32,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const SHT_DYNSYM: u32 = 11;
/// Section indices from here on are special (`SHN_LORESERVE`).
const SHN_LORESERVE: u16 = 0xff00;

fn sections(elf: &[u8]) -> Result<Vec<Section>> {
    let shoff = u64_at(elf, 40, "ELF header")?;
    let shentsize = u16_at(elf, 58, "ELF header")? as u64;
    let mut shnum = u16_at(elf, 60, "ELF header")? as u64;
    if shoff == 0 {
        return Ok(Vec::new());
    }
    if shentsize < 64 {
        return Err(bad(format!("section header size {shentsize} < 64")));
    }
    if shnum == 0 {
        // Extended numbering: the count is section 0's sh_size.
        let at = shoff.checked_add(32).ok_or_else(|| bad(format!("section header table at {shoff:#x}")))?;
        shnum = u64_at(elf, at, "section 0 (extended section count)")?;
    }
    let table = shnum.checked_mul(shentsize).ok_or_else(|| bad(format!("{shnum} section headers overflow")))?;
    bytes(elf, shoff, table, "section header table")?;
    (0..shnum)
        .map(|i| {
            let at = shoff + i * shentsize;
            let what = format!("section header {i}");
            Ok(Section {
                kind: u32_at(elf, at + 4, &what)?,
                addr: u64_at(elf, at + 16, &what)?,
                offset: u64_at(elf, at + 24, &what)?,
                size: u64_at(elf, at + 32, &what)?,
                link: u32_at(elf, at + 40, &what)?,
                entsize: u64_at(elf, at + 56, &what)?,
            })
        })
        .collect()
}

/// The longest symbol name read, bytes (kernel names are far shorter).
const MAX_NAME: usize = 4096;
/// The most symbols read in one input (all its ELFs and symbol tables).
const MAX_SYMBOLS: usize = 1 << 18;
/// The most kernels listed for one input.
const MAX_KERNELS: usize = 1 << 16;

/// What one input may make the parser do, so that a small hostile file
/// (symbol tables or bundle entries over the same bytes, long names)
/// cannot cost unbounded time or memory.
#[derive(Default)]
struct Budget {
    symbols: usize,
    kernels: usize,
}

/// The NUL-terminated name at `at` in string table `strtab`.
fn name_at<'a>(elf: &'a [u8], strtab: &Section, at: u32) -> Result<&'a [u8]> {
    let table = bytes(elf, strtab.offset, strtab.size, "string table")?;
    let rest = table.get(at as usize..).ok_or_else(|| bad(format!("symbol name at {at} outside its string table")))?;
    let window = &rest[..rest.len().min(MAX_NAME + 1)];
    let end = window.iter().position(|&b| b == 0).ok_or_else(|| {
        if window.len() > MAX_NAME {
            bad(format!("symbol name at {at} longer than {MAX_NAME} bytes"))
        } else {
            bad("symbol name not NUL-terminated")
        }
    })?;
    Ok(&rest[..end])
}

/// The kernels of one AMDGPU ELF (its `<name>.kd` symbols), sorted by name.
///
/// # Errors
/// [`Error::Hip`] when `elf` is not a little-endian ELF64 for `EM_AMDGPU`,
/// or a header, symbol, name or descriptor lies outside the input; more
/// than 2¹⁸ symbols, 2¹⁶ kernels or a name over 4096 bytes (bounds on the
/// work one input can cause).
pub fn elf_kernels(elf: &[u8]) -> Result<Vec<Kernel>> {
    Ok(parse_elf(elf, &mut Budget::default())?.1)
}

/// `e_flags` and the kernels of one AMDGPU ELF, charged to `budget`.
fn parse_elf(elf: &[u8], budget: &mut Budget) -> Result<(u32, Vec<Kernel>)> {
    let ident = bytes(elf, 0, 16, "ELF identification")?;
    if &ident[..4] != b"\x7fELF" {
        return Err(bad("not an ELF file (and not an offload bundle)"));
    }
    if ident[4] != 2 || ident[5] != 1 {
        return Err(bad(format!("ELF class {} / data {}: need 64-bit little-endian", ident[4], ident[5])));
    }
    let machine = u16_at(elf, 18, "ELF header")?;
    if machine != EM_AMDGPU {
        return Err(bad(format!("ELF machine {machine}, not AMDGPU ({EM_AMDGPU})")));
    }
    let e_flags = u32_at(elf, 48, "ELF header")?;
    let secs = sections(elf)?;
    let mut kernels: Vec<Kernel> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (si, s) in secs.iter().enumerate() {
        if s.kind != SHT_SYMTAB && s.kind != SHT_DYNSYM {
            continue;
        }
        let strtab = secs
            .get(s.link as usize)
            .ok_or_else(|| bad(format!("symbol table {si} links to missing section {}", s.link)))?;
        let entsize = if s.entsize == 0 { 24 } else { s.entsize };
        if entsize < 24 {
            return Err(bad(format!("symbol table {si}: entry size {entsize} < 24")));
        }
        bytes(elf, s.offset, s.size, &format!("symbol table {si}"))?;
        let count = s.size / entsize;
        budget.symbols = budget.symbols.saturating_add(usize::try_from(count).unwrap_or(usize::MAX));
        if budget.symbols > MAX_SYMBOLS {
            return Err(bad(format!("more than {MAX_SYMBOLS} symbols")));
        }
        for k in 0..count {
            let at = s.offset + k * entsize;
            let what = format!("symbol {k} of table {si}");
            let name = name_at(elf, strtab, u32_at(elf, at, &what)?)?;
            let Some(kernel) = name.strip_suffix(b".kd") else { continue };
            let kernel = String::from_utf8(kernel.to_vec()).map_err(|_| bad(format!("{what}: name not UTF-8")))?;
            if !seen.insert(kernel.clone()) {
                continue; // in .symtab and .dynsym both
            }
            budget.kernels += 1;
            if budget.kernels > MAX_KERNELS {
                return Err(bad(format!("more than {MAX_KERNELS} kernels")));
            }
            let shndx = u16_at(elf, at + 6, &what)?;
            let value = u64_at(elf, at + 8, &what)?;
            let size = u64_at(elf, at + 16, &what)?;
            let desc = descriptor(elf, &secs, shndx, value, size).map_err(|e| match e {
                Error::Hip { detail } => Error::Hip { detail: format!("{detail} (kernel {kernel})") },
                other => other,
            })?;
            // kernarg_size: bytes 8..12; kernel_code_properties: bytes 56..58,
            // ENABLE_WAVEFRONT_SIZE32 its bit 10 (descriptor bit 458).
            let kernarg_size = u32_at(desc, 8, "kernel descriptor")?;
            let props = u16_at(desc, 56, "kernel descriptor")?;
            let wave_size = if props & (1 << 10) != 0 { 32 } else { 64 };
            kernels.push(Kernel { name: kernel, wave_size, kernarg_size });
        }
    }
    kernels.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((e_flags, kernels))
}

/// The 64 descriptor bytes of a `.kd` symbol in section `shndx` at address `value`.
fn descriptor<'a>(elf: &'a [u8], secs: &[Section], shndx: u16, value: u64, size: u64) -> Result<&'a [u8]> {
    if shndx == 0 || shndx >= SHN_LORESERVE {
        return Err(bad(format!("kernel descriptor in no section (index {shndx:#x})")));
    }
    if size != 0 && size < DESCRIPTOR_SIZE as u64 {
        return Err(bad(format!("kernel descriptor of {size} bytes < {DESCRIPTOR_SIZE}")));
    }
    let sec = secs.get(shndx as usize).ok_or_else(|| bad(format!("kernel descriptor in missing section {shndx}")))?;
    if sec.kind == SHT_NOBITS {
        return Err(bad("kernel descriptor in a section without file bytes"));
    }
    let rel = value
        .checked_sub(sec.addr)
        .filter(|r| r.checked_add(DESCRIPTOR_SIZE as u64).is_some_and(|e| e <= sec.size))
        .ok_or_else(|| bad(format!("kernel descriptor at {value:#x} outside its section")))?;
    bytes(elf, sec.offset.saturating_add(rel), DESCRIPTOR_SIZE as u64, "kernel descriptor")
}

/// The device code in `data`: every non-host entry of an offload bundle, or
/// the one raw ELF.
///
/// # Errors
/// [`Error::Hip`] for input that is neither, or any malformed part
/// ([`bundle_entries`], [`elf_kernels`]), naming the entry.
pub fn parse(data: &[u8]) -> Result<Vec<DeviceCode>> {
    if !is_bundle(data) && !data.starts_with(COMPRESSED_MAGIC) {
        let (e_flags, kernels) = parse_elf(data, &mut Budget::default())?;
        return Ok(vec![DeviceCode { target: String::new(), e_flags, kernels }]);
    }
    let mut out = Vec::new();
    let mut budget = Budget::default();
    for e in bundle_entries(data)? {
        if e.triple.starts_with("host-") {
            continue;
        }
        let elf = e
            .offset
            .checked_add(e.size)
            .and_then(|end| data.get(e.offset..end))
            .ok_or_else(|| bad(format!("bundle entry {} outside the input", e.triple)))?;
        let (e_flags, kernels) = parse_elf(elf, &mut budget).map_err(|err| match err {
            Error::Hip { detail } => Error::Hip { detail: format!("{detail} (bundle entry {})", e.triple) },
            other => other,
        })?;
        out.push(DeviceCode { target: e.triple, e_flags, kernels });
    }
    Ok(out)
}

/// The names of every kernel in `data` (all device entries), sorted, each once.
///
/// # Errors
/// As [`parse`].
pub fn kernel_names(data: &[u8]) -> Result<Vec<String>> {
    let mut names: Vec<String> = parse(data)?.into_iter().flat_map(|d| d.kernels.into_iter().map(|k| k.name)).collect();
    names.sort();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal AMDGPU ELF: null section, .rodata with one descriptor per
    /// kernel, .strtab, .symtab (null symbol, then a `.kd` and a plain
    /// symbol per kernel).
    pub(super) fn tiny_elf(kernels: &[(&str, bool)]) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut syms = vec![0u8; 24];
        let mut rodata = Vec::new();
        for (i, (name, wave32)) in kernels.iter().enumerate() {
            let mut d = [0u8; 64];
            d[8..12].copy_from_slice(&(24u32 + i as u32).to_le_bytes());
            if *wave32 {
                d[57] |= 1 << 2; // bit 10 of the u16 at 56
            }
            let addr = 0x1000 + rodata.len() as u64;
            rodata.extend_from_slice(&d);
            for (suffix, value) in [(".kd", addr), ("", 0x2000)] {
                let name_off = strtab.len() as u32;
                strtab.extend_from_slice(format!("{name}{suffix}").as_bytes());
                strtab.push(0);
                let mut s = [0u8; 24];
                s[0..4].copy_from_slice(&name_off.to_le_bytes());
                s[4] = 0x11;
                s[6..8].copy_from_slice(&1u16.to_le_bytes());
                s[8..16].copy_from_slice(&value.to_le_bytes());
                s[16..24].copy_from_slice(&64u64.to_le_bytes());
                syms.extend_from_slice(&s);
            }
        }
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[6] = 1;
        elf[18..20].copy_from_slice(&EM_AMDGPU.to_le_bytes());
        elf[48..52].copy_from_slice(&0x53fu32.to_le_bytes());
        let ro_off = elf.len() as u64;
        elf.extend_from_slice(&rodata);
        let str_off = elf.len() as u64;
        elf.extend_from_slice(&strtab);
        let sym_off = elf.len() as u64;
        elf.extend_from_slice(&syms);
        let shoff = elf.len() as u64;
        let sh = |kind: u32, addr: u64, off: u64, size: u64, link: u32, entsize: u64| {
            let mut h = [0u8; 64];
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[16..24].copy_from_slice(&addr.to_le_bytes());
            h[24..32].copy_from_slice(&off.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            h
        };
        elf.extend_from_slice(&[0u8; 64]);
        elf.extend_from_slice(&sh(1, 0x1000, ro_off, rodata.len() as u64, 0, 0));
        elf.extend_from_slice(&sh(3, 0, str_off, strtab.len() as u64, 0, 0));
        elf.extend_from_slice(&sh(SHT_SYMTAB, 0, sym_off, syms.len() as u64, 2, 24));
        elf[40..48].copy_from_slice(&shoff.to_le_bytes());
        elf[58..60].copy_from_slice(&64u16.to_le_bytes());
        elf[60..62].copy_from_slice(&4u16.to_le_bytes());
        elf
    }

    /// An offload bundle of a host entry (empty) and the given device entries.
    pub(super) fn tiny_bundle(devices: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut entries: Vec<(String, Vec<u8>)> = vec![("host-x86_64-unknown-linux-gnu".into(), Vec::new())];
        entries.extend(devices.iter().map(|(t, e)| (t.to_string(), e.clone())));
        let table: usize = entries.iter().map(|(t, _)| 24 + t.len()).sum();
        let mut out = BUNDLE_MAGIC.to_vec();
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        let mut at = (out.len() + table) as u64;
        for (t, e) in &entries {
            out.extend_from_slice(&at.to_le_bytes());
            out.extend_from_slice(&(e.len() as u64).to_le_bytes());
            out.extend_from_slice(&(t.len() as u64).to_le_bytes());
            out.extend_from_slice(t.as_bytes());
            at += e.len() as u64;
        }
        for (_, e) in &entries {
            out.extend_from_slice(e);
        }
        out
    }

    #[test]
    fn raw_elf_kernels_and_wave_sizes() {
        let elf = tiny_elf(&[("sg_b", true), ("sg_a", false)]);
        let ks = elf_kernels(&elf).unwrap();
        assert_eq!(ks.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["sg_a", "sg_b"]);
        assert_eq!((ks[0].wave_size, ks[1].wave_size), (64, 32));
        assert_eq!((ks[0].kernarg_size, ks[1].kernarg_size), (25, 24));
        let p = parse(&elf).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].target, "");
        assert_eq!(p[0].e_flags & 0xff, 0x3f);
    }

    #[test]
    fn bundles_skip_the_host_entry() {
        let b = tiny_bundle(&[
            ("hipv4-amdgcn-amd-amdhsa--gfx90a", tiny_elf(&[("k1", false), ("k2", false)])),
            ("hipv4-amdgcn-amd-amdhsa--gfx1030", tiny_elf(&[("k1", true), ("k3", true)])),
        ]);
        let e = bundle_entries(&b).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].size, 0);
        let p = parse(&b).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].target, "hipv4-amdgcn-amd-amdhsa--gfx1030");
        assert!(p[1].kernels.iter().all(|k| k.wave_size == 32));
        assert_eq!(kernel_names(&b).unwrap(), ["k1", "k2", "k3"]);
    }

    /// Every truncation and many corruptions of valid input are errors, never panics.
    #[test]
    fn hostile_sizes_are_bounded_errors() {
        // Entries repeating one ELF: its kernels are charged once per
        // entry, so enough entries hit the bound instead of listing
        // millions of kernels.
        let names: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
        let elf = tiny_elf(&names.iter().map(|n| (n.as_str(), false)).collect::<Vec<_>>());
        let few: Vec<(&str, Vec<u8>)> = (0..4).map(|_| ("hipv4-amdgcn-amd-amdhsa--gfx90a", elf.clone())).collect();
        assert_eq!(kernel_names(&tiny_bundle(&few)).unwrap().len(), 300);
        let many: Vec<(&str, Vec<u8>)> = (0..220).map(|_| ("hipv4-amdgcn-amd-amdhsa--gfx90a", elf.clone())).collect();
        let e = kernel_names(&tiny_bundle(&many)).unwrap_err().to_string();
        assert!(e.contains("more than 65536 kernels"), "{e}");
        // A name past the bound is an error, not a scan of the whole table.
        let long = "a".repeat(MAX_NAME + 10);
        let e = elf_kernels(&tiny_elf(&[(long.as_str(), false)])).unwrap_err().to_string();
        assert!(e.contains("longer than 4096"), "{e}");
        // An extended section count read past the end of the address space.
        let mut x = tiny_elf(&[("k", false)]);
        x[40..48].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        x[60..62].copy_from_slice(&0u16.to_le_bytes());
        assert!(elf_kernels(&x).is_err());
    }

    #[test]
    fn truncated_and_garbage_input_are_errors() {
        let elf = tiny_elf(&[("sg_x", false), ("sg_y", true)]);
        let bundle = tiny_bundle(&[("hipv4-amdgcn-amd-amdhsa--gfx90a", elf.clone())]);
        for input in [&elf, &bundle] {
            for n in 0..input.len() {
                assert!(parse(&input[..n]).is_err(), "truncated to {n} of {} bytes", input.len());
            }
            // Flip every byte in turn: Ok or Err, but no panic.
            let mut x = input.clone();
            for i in 0..x.len() {
                for v in [0x00, 0xff, 0x80] {
                    let old = x[i];
                    x[i] = v;
                    let _ = parse(&x);
                    x[i] = old;
                }
            }
        }
        for garbage in [&b""[..], b"\x7fELF", b"CCOB0000", b"__CLANG_OFFLOAD_BUNDLE__", &[0xffu8; 200][..]] {
            assert!(parse(garbage).is_err());
        }
        let e = parse(b"CCOB\x01\x00\x00\x00").unwrap_err().to_string();
        assert!(e.contains("compressed"), "{e}");
        // An entry count the input cannot hold.
        let mut b = BUNDLE_MAGIC.to_vec();
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&b).unwrap_err().to_string().contains("entries"));
        // An entry pointing past the end.
        let mut b = tiny_bundle(&[("hipv4-amdgcn-amd-amdhsa--gfx90a", elf.clone())]);
        let off = BUNDLE_MAGIC.len() + 8 + 24 + "host-x86_64-unknown-linux-gnu".len();
        b[off..off + 8].copy_from_slice(&(u64::MAX - 4).to_le_bytes());
        assert!(parse(&b).is_err());
        // Not AMDGPU.
        let mut x86 = elf.clone();
        x86[18] = 62;
        assert!(parse(&x86).unwrap_err().to_string().contains("AMDGPU"));
    }
}
