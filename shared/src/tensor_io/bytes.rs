//! A cheaply clonable, immutable byte buffer: a memory map natively, an
//! owned `Vec<u8>` in the browser (no mmap on wasm32).

use std::sync::Arc;

/// Immutable shared bytes of one file.
#[derive(Clone)]
pub struct Bytes(Arc<Inner>);

enum Inner {
    Owned(Vec<u8>),
    #[cfg(not(target_arch = "wasm32"))]
    Map(memmap2::Mmap),
}

impl Bytes {
    /// Wraps owned bytes (browser uploads, tests).
    pub fn from_vec(v: Vec<u8>) -> Self {
        Bytes(Arc::new(Inner::Owned(v)))
    }

    /// Drops the pages of `range` (byte offsets) from this process's
    /// resident memory when the bytes are a memory map
    /// (`madvise(MADV_DONTNEED)`; the kernel's page cache keeps them, and a
    /// later read maps them again), so a reader that decodes a
    /// checkpoint tensor by tensor does not hold the whole file in its
    /// resident set beside what it built from it (a 14 GB MoE loaded in
    /// bf16: docs/benchmarks.md, "DUME at the papers' size"). A no-op for
    /// owned bytes, for an empty or out-of-bounds range and where the
    /// system refuses the advice.
    pub fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let Inner::Map(m) = &*self.0 {
            if range.start < range.end && range.end <= m.len() {
                // SAFETY: the map is read-only and shared (`Mmap::map`); the
                // studio never writes to files it reads. Dropping its pages
                // only makes the next access fault them in again from the
                // file: no slice handed out earlier changes.
                let _ =
                    unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, range.start, range.len()) };
            }
        }
        let _ = range;
    }

    /// Memory-maps a file read-only (native only).
    ///
    /// # Errors
    /// [`crate::StudioError::Io`] naming the path.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn map_file(path: &std::path::Path) -> crate::Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| crate::StudioError::io(path.display(), e))?;
        // SAFETY: the map is read-only; the studio never writes to files it
        // reads (outputs go to a temp file renamed into place), so the
        // mapping is not mutated underneath us by this process.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| crate::StudioError::io(path.display(), e))?;
        Ok(Bytes(Arc::new(Inner::Map(map))))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &*self.0 {
            Inner::Owned(v) => v,
            #[cfg(not(target_arch = "wasm32"))]
            Inner::Map(m) => m,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

/// The first line of every Git LFS pointer file.
const LFS_PREFIX: &[u8] = b"version https://git-lfs.github.com/spec/";

/// When `bytes` is a Git LFS pointer file (a small text file naming an
/// object that `git lfs pull` would download), the size of the object it
/// points to (`size N`; 0 when the line is absent).
pub fn lfs_pointer_size(bytes: &[u8]) -> Option<u64> {
    if bytes.len() > 1024 || !bytes.starts_with(LFS_PREFIX) {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    Some(text.lines().find_map(|l| l.strip_prefix("size ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0))
}

/// A [`crate::StudioError::Format`] naming `file` as a Git LFS pointer (with the
/// fix) when `bytes` is one.
///
/// # Errors
/// That error; `Ok` for any other bytes.
pub fn refuse_lfs_pointer(bytes: &[u8], file: &str, format: &'static str) -> crate::Result<()> {
    match lfs_pointer_size(bytes) {
        Some(size) => Err(crate::StudioError::format(
            file,
            format,
            format!(
                "this is a Git LFS pointer file ({} bytes) standing for a {size}-byte object, not the model itself: \
                 run `git lfs pull` in the repository it came from (or download the real file)",
                bytes.len()
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lfs_pointers_are_recognised() {
        let p = b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 538970456\n";
        assert_eq!(lfs_pointer_size(p), Some(538_970_456));
        assert_eq!(lfs_pointer_size(b"GGUF\x03\0\0\0"), None);
        let e = refuse_lfs_pointer(p, "model.safetensors", "safetensors").unwrap_err().to_string();
        assert!(e.contains("git lfs pull") && e.contains("538970456-byte") && e.contains("model.safetensors"), "{e}");
    }

    /// This process's file-backed resident memory (`RssFile`), bytes.
    #[cfg(target_os = "linux")]
    fn rss_file() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: u64 = s
            .lines()
            .find_map(|l| l.strip_prefix("RssFile:"))
            .unwrap()
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap();
        kb * 1024
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn release_drops_mapped_pages_and_the_bytes_stay_readable() {
        const N: usize = 64 << 20;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        let data: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let b = Bytes::map_file(&p).unwrap();
        let before = rss_file();
        let sum: u64 = b.as_slice().iter().map(|&x| x as u64).sum();
        let touched = rss_file();
        b.release(0..N);
        let released = rss_file();
        eprintln!("RssFile: {before} -> {touched} after reading 64 MiB -> {released} after release");
        assert!(touched >= before + (N as u64) / 2, "reading maps the pages in");
        assert!(released + (N as u64) / 2 <= touched, "release drops them");
        // Still the same bytes (faulted in again from the file).
        assert_eq!(b.as_slice().iter().map(|&x| x as u64).sum::<u64>(), sum);
        assert_eq!(b.as_slice()[N - 1], data[N - 1]);
        // Owned bytes and odd ranges: nothing happens.
        let o = Bytes::from_vec(vec![1, 2, 3]);
        o.release(0..3);
        b.release(std::ops::Range { start: 5, end: 2 });
        b.release(0..N + 1);
        assert_eq!(o.as_slice(), &[1, 2, 3]);
    }
}
