//! A cheaply clonable, immutable byte buffer: a memory map natively, an
//! owned `Vec<u8>` in the browser (no mmap on wasm32).

use std::sync::Arc;

/// Immutable shared bytes of one file.
#[derive(Clone)]
pub struct Bytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl Bytes {
    /// Wraps owned bytes (browser uploads, tests).
    pub fn from_vec(v: Vec<u8>) -> Self {
        Bytes(Arc::new(v))
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
        Ok(Bytes(Arc::new(map)))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        (*self.0).as_ref()
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
}
