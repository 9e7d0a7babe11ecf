//! Bytes of a memory-mapped file that a device may compute on in place:
//! the weights of a GGUF file opened with [`crate::gguf::GgufFile::open`].
//!
//! A [`MappedBytes`] names a byte range of an open file and reads it
//! through the file's read-only mapping (page-cache pages, shared with every
//! other mapping of the file and evictable, as llama.cpp's `llama_mmap`).
//! A device that computes on host memory adopts the range as a buffer
//! ([`crate::Backend::map_buffer`]; the CPU backend does) instead of
//! allocating one and copying: the weights then cost their file size once,
//! however many CPU devices mirror them. Devices with memory of their own
//! (GPUs) copy the bytes as before.

use std::fs::File;
use std::sync::Arc;

/// A byte range `offset .. offset + len` of a memory-mapped file.
///
/// Cloning shares the mapping (no copy). Reading the bytes
/// ([`MappedBytes::bytes`]) touches the file's pages; nothing is read before.
#[derive(Clone)]
pub struct MappedBytes {
    file: Arc<File>,
    map: Arc<memmap2::Mmap>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedBytes({}..+{})", self.offset, self.len)
    }
}

impl MappedBytes {
    /// The range `offset .. offset + len` of `file`, read through `map`
    /// (a mapping of the whole file); `None` if the range leaves the map.
    pub(crate) fn new(file: Arc<File>, map: Arc<memmap2::Mmap>, offset: usize, len: usize) -> Option<MappedBytes> {
        (offset.checked_add(len)? <= map.len()).then_some(MappedBytes { file, map, offset, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Byte offset of the range in the file.
    pub fn file_offset(&self) -> usize {
        self.offset
    }

    /// The bytes (a slice of the file's read-only mapping).
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    /// The sub-range `start .. start + len` of this range; `None` if it
    /// leaves it.
    pub fn sub(&self, start: usize, len: usize) -> Option<MappedBytes> {
        (start.checked_add(len)? <= self.len).then(|| MappedBytes { offset: self.offset + start, len, ..self.clone() })
    }

    /// A private, writable mapping of the range (`MAP_PRIVATE`): reads share
    /// the file's page-cache pages; a write copies the page it touches into
    /// memory of this mapping alone, so neither the file nor another
    /// mapping of it changes. The pages are mapped at once where the
    /// system can (`MADV_POPULATE_READ`, Linux 5.14: read-only, so no page
    /// is copied; one call instead of a fault per page on the first step,
    /// as llama.cpp's `MAP_POPULATE`), else read ahead (`MADV_WILLNEED`).
    ///
    /// # Errors
    /// The system's error if the range cannot be mapped.
    pub(crate) fn map_private(&self) -> std::io::Result<memmap2::MmapMut> {
        // SAFETY: a private mapping of a file this process opened read-only;
        // memmap2's contract is that the file is not truncated or modified
        // while mapped, the same contract under which `GgufFile::open` maps
        // it (and llama.cpp maps model files). Writes through the mapping go
        // to private copies of the pages, never to the file.
        let map =
            unsafe { memmap2::MmapOptions::new().offset(self.offset as u64).len(self.len).map_copy(&*self.file)? };
        // Hints: a failure only means the pages fault in on first use.
        #[cfg(target_os = "linux")]
        let populated = map.advise(memmap2::Advice::PopulateRead).is_ok();
        #[cfg(not(target_os = "linux"))]
        let populated = false;
        #[cfg(unix)]
        if !populated {
            let _ = map.advise(memmap2::Advice::WillNeed);
        }
        #[cfg(not(unix))]
        let _ = populated;
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> (Arc<File>, Arc<memmap2::Mmap>) {
        let mut f = tempfile_in_target();
        f.0.write_all(bytes).unwrap();
        let file = File::open(&f.1).unwrap();
        // SAFETY: a test file nobody else writes.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        std::fs::remove_file(&f.1).unwrap();
        (Arc::new(file), Arc::new(map))
    }

    fn tempfile_in_target() -> (File, std::path::PathBuf) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("shardgraph-mapped-{}-{n}", std::process::id()));
        (File::create(&p).unwrap(), p)
    }

    #[test]
    fn ranges_read_their_bytes_and_private_maps_do_not_write_the_file() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (file, map) = file_of(&data);
        assert!(MappedBytes::new(file.clone(), map.clone(), 9_000, 1_001).is_none());
        let m = MappedBytes::new(file, map, 4_097, 3_000).unwrap();
        assert_eq!(m.bytes(), &data[4_097..7_097]);
        let s = m.sub(100, 50).unwrap();
        assert_eq!((s.file_offset(), s.len()), (4_197, 50));
        assert_eq!(s.bytes(), &data[4_197..4_247]);
        assert!(m.sub(2_990, 11).is_none());
        // An offset off page boundaries: the private map starts at the range.
        let mut p = m.map_private().unwrap();
        assert_eq!(&p[..], &data[4_097..7_097]);
        p[0] ^= 0xff;
        let p2 = m.map_private().unwrap();
        assert_eq!(p2[0], data[4_097], "a write to one private map reached another");
        assert_eq!(m.bytes()[0], data[4_097], "a write to a private map reached the file's map");
    }
}
