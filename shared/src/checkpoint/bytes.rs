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
