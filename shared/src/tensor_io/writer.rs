//! Safetensors output: streaming, sharded, atomic.
//!
//! The caller declares every tensor (name, dtype, shape) up front, then
//! streams the data in that order; the writer assigns tensors to shards of
//! at most `max_shard_bytes`, writes each shard's header before its data,
//! and writes `model.safetensors.index.json` when there is more than one
//! shard (file names `model-0000i-of-0000n.safetensors`, as transformers'
//! `save_pretrained`). Everything goes to a temporary sibling directory that
//! is renamed into place by [`SafetensorsWriter::finish`]; dropping the
//! writer unfinished removes it, so no half-written output is left behind.
//!
//! Format: <https://github.com/huggingface/safetensors>.

use std::collections::BTreeMap;

use super::DType;
use crate::error::{Result, StudioError};

/// A tensor to be written: name, dtype and shape (outermost first).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    /// Tensor name.
    pub name: String,
    /// Float dtype (F32, F16, BF16).
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl PlannedTensor {
    /// Bytes of this tensor's data.
    pub fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.float_size().unwrap_or(0)
    }
}

/// Options of [`SafetensorsWriter`].
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Largest shard size in bytes (data only); a single tensor larger than
    /// this gets a shard of its own. Default 5 GB (transformers' default).
    pub max_shard_bytes: u64,
    /// `__metadata__` written into every shard (e.g. `format: pt`).
    pub metadata: BTreeMap<String, String>,
    /// The model card, written as `README.md` by
    /// [`SafetensorsWriter::finish`] with the other files (its title the
    /// output directory's name when empty); the methods add their facts to
    /// it before writing.
    pub card: Option<crate::tensor_io::card::ModelCard>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        let mut metadata = BTreeMap::new();
        metadata.insert("format".to_string(), "pt".to_string());
        WriteOptions { max_shard_bytes: 5_000_000_000, metadata, card: None }
    }
}

impl WriteOptions {
    /// These options with `card` as the model card.
    pub fn with_card(mut self, card: Option<crate::tensor_io::card::ModelCard>) -> Self {
        self.card = card;
        self
    }

    /// Adds a fact to the card, when there is one.
    pub fn card_detail(&mut self, key: &str, value: impl Into<String>) {
        if let Some(c) = self.card.as_mut() {
            c.detail(key, value);
        }
    }
}

/// Builds one shard's header bytes (length prefix + JSON padded with spaces
/// to a multiple of 8), for tensors laid out back to back in `tensors` order.
pub fn shard_header(tensors: &[PlannedTensor], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if !metadata.is_empty() {
        map.insert("__metadata__".into(), serde_json::to_value(metadata).expect("string map"));
    }
    let mut off = 0usize;
    for t in tensors {
        let end = off + t.byte_len();
        map.insert(
            t.name.clone(),
            serde_json::json!({
                "dtype": t.dtype.safetensors_name().unwrap_or("F32"),
                "shape": t.shape,
                "data_offsets": [off, end],
            }),
        );
        off = end;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(map)).expect("json");
    while !(json.len() + 8).is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    out
}

/// Serialises tensors into one in-memory safetensors file (small models,
/// the browser's download).
///
/// # Errors
/// [`StudioError::Invalid`] when a data length does not match its plan.
pub fn serialize_to_vec(tensors: &[(PlannedTensor, &[u8])], metadata: &BTreeMap<String, String>) -> Result<Vec<u8>> {
    let plan: Vec<PlannedTensor> = tensors.iter().map(|(p, _)| p.clone()).collect();
    let mut out = shard_header(&plan, metadata);
    for (p, data) in tensors {
        if data.len() != p.byte_len() {
            return Err(StudioError::Invalid(format!(
                "tensor `{}`: {} bytes given, dtype {} and shape {:?} need {}",
                p.name,
                data.len(),
                p.dtype,
                p.shape,
                p.byte_len()
            )));
        }
        out.extend_from_slice(data);
    }
    Ok(out)
}

/// Splits a plan into shards of at most `max` data bytes (order kept).
pub fn plan_shards(plan: &[PlannedTensor], max: u64) -> Vec<Vec<PlannedTensor>> {
    let mut shards: Vec<Vec<PlannedTensor>> = vec![];
    let mut cur: Vec<PlannedTensor> = vec![];
    let mut size = 0u64;
    for t in plan {
        let len = t.byte_len() as u64;
        if !cur.is_empty() && size + len > max {
            shards.push(std::mem::take(&mut cur));
            size = 0;
        }
        size += len;
        cur.push(t.clone());
    }
    if !cur.is_empty() || shards.is_empty() {
        shards.push(cur);
    }
    shards
}

#[cfg(not(target_arch = "wasm32"))]
pub use native::{check_out_dir, remove_stale_temporaries, SafetensorsWriter, STALE_AFTER};

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::io::{BufWriter, Write};
    use std::path::{Path, PathBuf};

    use super::*;

    /// Removes what an interrupted write for `out` left beside it (Ctrl-C,
    /// kill, power loss): the temporary `.NAME.tmp-PID` (a directory of
    /// shards, or a token file) of a process `PID` that no longer runs
    /// (Linux with `/proc` mounted: `/proc/PID`; elsewhere nothing is
    /// removed) and that nothing has written to for [`STALE_AFTER`] (a live
    /// writer on another machine sharing the filesystem, or in another PID
    /// namespace, is not in our `/proc`). The safetensors and token-file
    /// writers call it before checking the free space, so that a rerun gets
    /// that space back instead of leaving a model's worth of orphaned shards
    /// per attempt.
    pub fn remove_stale_temporaries(out: &Path) {
        if !cfg!(target_os = "linux") || !Path::new("/proc/self").exists() {
            return;
        }
        let stem = format!(".{}.tmp-", out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        let dir = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix(&stem).and_then(|p| p.parse::<u32>().ok()) else { continue };
            let p = e.path();
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() && untouched(&p) {
                let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            }
        }
    }

    /// How long a dead process's temporary must have been left alone
    /// before [`remove_stale_temporaries`] removes it.
    pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

    /// Whether `p` (and, for a directory, every entry in it) was last
    /// modified at least [`STALE_AFTER`] ago.
    fn untouched(p: &Path) -> bool {
        let old = |q: &Path| {
            std::fs::metadata(q)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= STALE_AFTER)
        };
        old(p) && std::fs::read_dir(p).map_or(true, |es| es.flatten().all(|e| old(&e.path())))
    }

    /// Refuses an output directory that exists and is not empty (the
    /// studio never overwrites a user's files). [`SafetensorsWriter::create`]
    /// checks it; a command whose work comes before the writer (`route`'s
    /// statistics pass) checks it first too, so that it does not fail after
    /// the work.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] naming the directory; I/O errors reading it.
    pub fn check_out_dir(out_dir: &Path) -> Result<()> {
        if out_dir.exists() {
            let non_empty =
                std::fs::read_dir(out_dir).map_err(|e| StudioError::io(out_dir.display(), e))?.next().is_some();
            if non_empty {
                return Err(StudioError::Invalid(format!(
                    "output directory {} already exists and is not empty; choose a new --out",
                    out_dir.display()
                )));
            }
        }
        Ok(())
    }

    /// Streaming, sharded, atomic writer of a safetensors checkpoint
    /// directory (see the module docs).
    pub struct SafetensorsWriter {
        out_dir: PathBuf,
        tmp_dir: Option<PathBuf>,
        shards: Vec<Vec<PlannedTensor>>,
        names: Vec<String>,
        opts: WriteOptions,
        shard: usize,
        pos_in_shard: usize,
        file: Option<BufWriter<std::fs::File>>,
    }

    impl SafetensorsWriter {
        /// Starts writing into a temporary sibling of `out_dir`.
        ///
        /// # Errors
        /// [`StudioError::Invalid`] if `out_dir` exists and is not empty (the
        /// studio never overwrites a user's files), if a dtype is not a
        /// float type or a name repeats; I/O errors.
        pub fn create(out_dir: &Path, plan: Vec<PlannedTensor>, opts: WriteOptions) -> Result<Self> {
            check_out_dir(out_dir)?;
            let mut seen = std::collections::HashSet::new();
            for t in &plan {
                if t.dtype.float_size().is_none() {
                    return Err(StudioError::Invalid(format!("tensor `{}`: cannot write dtype {}", t.name, t.dtype)));
                }
                if !seen.insert(t.name.clone()) {
                    return Err(StudioError::Invalid(format!("tensor `{}` planned twice", t.name)));
                }
            }
            let parent = out_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            std::fs::create_dir_all(parent).map_err(|e| StudioError::io(parent.display(), e))?;
            remove_stale_temporaries(out_dir);
            check_free_space(out_dir, parent, &plan)?;
            let base = out_dir.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "out".into());
            let tmp = parent.join(format!(".{base}.tmp-{}", std::process::id()));
            if tmp.exists() {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            std::fs::create_dir(&tmp).map_err(|e| StudioError::io(tmp.display(), e))?;
            let shards = plan_shards(&plan, opts.max_shard_bytes.max(1));
            let names = plan.iter().map(|t| t.name.clone()).collect();
            let mut w = SafetensorsWriter {
                out_dir: out_dir.to_path_buf(),
                tmp_dir: Some(tmp),
                shards,
                names,
                opts,
                shard: 0,
                pos_in_shard: 0,
                file: None,
            };
            w.open_shard()?;
            Ok(w)
        }

        fn shard_file_name(&self, i: usize) -> String {
            if self.shards.len() == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", i + 1, self.shards.len())
            }
        }

        fn tmp(&self) -> &Path {
            self.tmp_dir.as_deref().expect("writer is open")
        }

        fn open_shard(&mut self) -> Result<()> {
            let path = self.tmp().join(self.shard_file_name(self.shard));
            let f = std::fs::File::create(&path).map_err(|e| StudioError::io(path.display(), e))?;
            let mut f = BufWriter::with_capacity(1 << 20, f);
            let header = shard_header(&self.shards[self.shard], &self.opts.metadata);
            f.write_all(&header).map_err(|e| StudioError::io(path.display(), e))?;
            self.file = Some(f);
            self.pos_in_shard = 0;
            Ok(())
        }

        /// Writes the next tensor's little-endian data.
        ///
        /// # Errors
        /// [`StudioError::Invalid`] if `name` is not the next planned tensor
        /// or the byte count is wrong; I/O errors.
        pub fn write(&mut self, name: &str, data: &[u8]) -> Result<()> {
            while self.pos_in_shard == self.shards[self.shard].len() {
                self.close_shard()?;
                self.shard += 1;
                if self.shard >= self.shards.len() {
                    return Err(StudioError::Invalid(format!("tensor `{name}` was not planned")));
                }
                self.open_shard()?;
            }
            let expected = &self.shards[self.shard][self.pos_in_shard];
            if expected.name != name {
                return Err(StudioError::Invalid(format!(
                    "tensors must be written in plan order: expected `{}`, got `{name}`",
                    expected.name
                )));
            }
            if expected.byte_len() != data.len() {
                return Err(StudioError::Invalid(format!(
                    "tensor `{name}`: {} bytes given, {} expected for dtype {} shape {:?}",
                    data.len(),
                    expected.byte_len(),
                    expected.dtype,
                    expected.shape
                )));
            }
            let tmp = self.tmp().display().to_string();
            self.file.as_mut().expect("open shard").write_all(data).map_err(|e| StudioError::io(tmp, e))?;
            self.pos_in_shard += 1;
            Ok(())
        }

        /// Writes the next tensor from f32 values, converting to its dtype.
        ///
        /// # Errors
        /// As [`SafetensorsWriter::write`].
        pub fn write_f32(&mut self, name: &str, values: &[f32]) -> Result<()> {
            let dtype = self
                .shards
                .iter()
                .flatten()
                .find(|t| t.name == name)
                .map(|t| t.dtype)
                .ok_or_else(|| StudioError::Invalid(format!("tensor `{name}` was not planned")))?;
            let file = self.out_dir.display().to_string();
            let bytes = super::super::dtype::f32_to_bytes(dtype, values, &file, name)?;
            self.write(name, &bytes)
        }

        fn close_shard(&mut self) -> Result<()> {
            if let Some(mut f) = self.file.take() {
                let tmp = self.tmp().display().to_string();
                f.flush().map_err(|e| StudioError::io(&tmp, e))?;
                f.get_ref().sync_all().map_err(|e| StudioError::io(&tmp, e))?;
            }
            Ok(())
        }

        /// Finishes: checks every planned tensor was written, writes the
        /// index (several shards), `extra_files` (e.g. `config.json`,
        /// `tokenizer.json`) and the model card of [`WriteOptions::card`]
        /// as `README.md` (an extra file of that name is then dropped: an
        /// input's card is not the output's), then renames the directory
        /// into place, so nothing half-written is ever visible.
        ///
        /// # Errors
        /// [`StudioError::Invalid`] when tensors are missing; I/O errors. On
        /// error the temporary directory is removed.
        pub fn finish(mut self, extra_files: &[(&str, Vec<u8>)]) -> Result<PathBuf> {
            let written: usize = self.shards[..self.shard].iter().map(|s| s.len()).sum::<usize>() + self.pos_in_shard;
            if written != self.names.len() {
                return Err(StudioError::Invalid(format!(
                    "only {written} of {} planned tensors were written (next: `{}`)",
                    self.names.len(),
                    self.names[written]
                )));
            }
            self.close_shard()?;
            // Empty trailing shards cannot exist (plan_shards never makes them).
            if self.shards.len() > 1 {
                let mut weight_map = BTreeMap::new();
                let mut total = 0usize;
                for (i, s) in self.shards.iter().enumerate() {
                    for t in s {
                        weight_map.insert(t.name.clone(), self.shard_file_name(i));
                        total += t.byte_len();
                    }
                }
                let idx = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
                write_synced(
                    &self.tmp().join("model.safetensors.index.json"),
                    &serde_json::to_vec_pretty(&idx).expect("json"),
                )?;
            }
            let card = self.opts.card.take().map(|mut c| {
                if c.title.is_empty() {
                    c.title = self.out_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                }
                c.render().into_bytes()
            });
            for (name, bytes) in extra_files {
                // An input's own card is never the output's.
                if card.is_some() && *name == crate::tensor_io::card::CARD_FILE {
                    continue;
                }
                write_synced(&self.tmp().join(name), bytes)?;
            }
            if let Some(card) = card {
                write_synced(&self.tmp().join(crate::tensor_io::card::CARD_FILE), &card)?;
            }
            // Durable before it is visible: every file above is on disk, then the directory's
            // entries, then (after the rename) the parent's. A training run prunes its older
            // checkpoints once this returns, so after a power cut the newest must be whole.
            sync_dir(self.tmp())?;
            let tmp = self.tmp_dir.take().expect("open");
            if self.out_dir.exists() {
                // Only an empty directory can be here (checked at create).
                std::fs::remove_dir(&self.out_dir).map_err(|e| StudioError::io(self.out_dir.display(), e))?;
            }
            std::fs::rename(&tmp, &self.out_dir).map_err(|e| {
                let _ = std::fs::remove_dir_all(&tmp);
                StudioError::io(self.out_dir.display(), e)
            })?;
            let parent = self.out_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            sync_dir(parent)?;
            Ok(self.out_dir.clone())
        }
    }

    /// Writes `bytes` to `path` and flushes them to the device (`fsync`).
    ///
    /// # Errors
    /// [`StudioError::Io`] naming `path`.
    fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
        let mut f = std::fs::File::create(path).map_err(|e| StudioError::io(path.display(), e))?;
        f.write_all(bytes).map_err(|e| StudioError::io(path.display(), e))?;
        f.sync_all().map_err(|e| StudioError::io(path.display(), e))
    }

    /// Flushes a directory's entries to the device (`fsync` on the
    /// directory: a rename or a new file in it survives a power cut). A
    /// no-op where directories cannot be opened as files (Windows) and on
    /// filesystems that do not sync directories (some FUSE, CIFS, 9p mounts
    /// answer EINVAL or ENOTSUP: the write is then as durable as they allow).
    ///
    /// # Errors
    /// [`StudioError::Io`] naming `dir`, for any other error.
    fn sync_dir(dir: &Path) -> Result<()> {
        #[cfg(unix)]
        match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
            Err(e) if matches!(e.kind(), std::io::ErrorKind::InvalidInput | std::io::ErrorKind::Unsupported) => {}
            r => r.map_err(|e| StudioError::io(dir.display(), e))?,
        }
        #[cfg(not(unix))]
        let _ = dir;
        Ok(())
    }

    /// Refuses a write that cannot fit: the tensor bytes of `plan` against
    /// the free space of `parent`'s filesystem (an `upcycle --experts 100000`
    /// used to write until the disk was full). Skipped when the free space
    /// cannot be read.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] naming the output, both sizes in GB.
    fn check_free_space(out_dir: &Path, parent: &Path, plan: &[PlannedTensor]) -> Result<()> {
        let need: u64 = plan
            .iter()
            .map(|t| t.shape.iter().product::<usize>() as u64 * t.dtype.float_size().unwrap_or(4) as u64)
            .sum();
        match fs4::available_space(parent) {
            Ok(free) if need > free => Err(StudioError::Invalid(format!(
                "output {}: the checkpoint needs {:.2} GB but its filesystem has {:.2} GB free; \
                 free some space or choose another --out",
                out_dir.display(),
                need as f64 / 1e9,
                free as f64 / 1e9
            ))),
            _ => Ok(()),
        }
    }

    impl Drop for SafetensorsWriter {
        fn drop(&mut self) {
            self.file.take();
            if let Some(tmp) = self.tmp_dir.take() {
                let _ = std::fs::remove_dir_all(tmp);
            }
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::tensor_io::safetensors_io::{SafetensorsFile, SafetensorsModel};
    use crate::tensor_io::{Bytes, TensorSource};

    fn plan() -> Vec<PlannedTensor> {
        vec![
            PlannedTensor { name: "a".into(), dtype: DType::F32, shape: vec![2, 3] },
            PlannedTensor { name: "b".into(), dtype: DType::BF16, shape: vec![5] },
            PlannedTensor { name: "c".into(), dtype: DType::F16, shape: vec![4, 4] },
        ]
    }

    #[test]
    fn in_memory_round_trip_preserves_dtype_and_values() {
        let a: Vec<u8> = [1f32, 2., 3., 4., 5., 6.].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = (0..5).flat_map(|i| half::bf16::from_f32(i as f32 * 0.5).to_le_bytes()).collect();
        let c: Vec<u8> = (0..16).flat_map(|i| half::f16::from_f32(i as f32 - 8.0).to_le_bytes()).collect();
        let p = plan();
        let bytes =
            serialize_to_vec(&[(p[0].clone(), &a), (p[1].clone(), &b), (p[2].clone(), &c)], &BTreeMap::new()).unwrap();
        // The reference reader accepts it.
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("b").unwrap().dtype(), safetensors::Dtype::BF16);
        let f = SafetensorsFile::parse(Bytes::from_vec(bytes), "mem").unwrap();
        assert_eq!(f.read_f32("a").unwrap(), vec![1., 2., 3., 4., 5., 6.]);
        assert_eq!(f.read_f32("b").unwrap(), vec![0., 0.5, 1., 1.5, 2.]);
        assert_eq!(f.read_f32("c").unwrap()[15], 7.0);
        assert_eq!(f.info("b").unwrap().dtype, DType::BF16);
    }

    #[test]
    fn sharded_atomic_write_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("model");
        let opts = WriteOptions { max_shard_bytes: 24, ..Default::default() };
        let mut w = SafetensorsWriter::create(&out, plan(), opts).unwrap();
        // Nothing at the destination until finish.
        w.write_f32("a", &[1., 2., 3., 4., 5., 6.]).unwrap();
        assert!(!out.exists());
        w.write_f32("b", &[0., 1., 2., 3., 4.]).unwrap();
        w.write_f32("c", &[0.25; 16]).unwrap();
        w.finish(&[("config.json", b"{}".to_vec())]).unwrap();
        assert!(out.join("model.safetensors.index.json").exists());
        assert!(out.join("model-00001-of-00003.safetensors").exists());
        let m = SafetensorsModel::open_dir(&out).unwrap();
        assert_eq!(m.read_f32("c").unwrap(), vec![0.25; 16]);
        assert_eq!(m.read_f32("a").unwrap()[5], 6.0);
        assert_eq!(m.info("b").unwrap().dtype, DType::BF16);
    }

    #[test]
    fn unfinished_writer_leaves_nothing_and_existing_output_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m");
        {
            let mut w = SafetensorsWriter::create(&out, plan(), WriteOptions::default()).unwrap();
            w.write_f32("a", &[0.; 6]).unwrap();
            // Wrong order is refused.
            assert!(w.write_f32("c", &[0.; 16]).unwrap_err().to_string().contains("plan order"));
        }
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "temp dir removed");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("mine.txt"), b"user data").unwrap();
        let e = SafetensorsWriter::create(&out, plan(), WriteOptions::default()).err().unwrap();
        assert!(e.to_string().contains("not empty"));
        assert_eq!(std::fs::read(out.join("mine.txt")).unwrap(), b"user data");
    }

    /// What a killed write left beside `out` (its temporary, named by a
    /// process that no longer runs) is removed by the next write to the same
    /// `out`; a live process's temporary and other names are kept.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_killed_writes_temporary_is_removed_by_the_next_write() {
        use std::path::Path;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m");
        let dead = (1_000_000u32..).find(|p| !Path::new(&format!("/proc/{p}")).exists()).unwrap();
        let stale = dir.path().join(format!(".m.tmp-{dead}"));
        std::fs::create_dir(&stale).unwrap();
        let shard = stale.join("model-00001-of-00002.safetensors");
        std::fs::write(&shard, vec![0u8; 1024]).unwrap();
        // A dead PID's temporary written to a moment ago may be a live writer's elsewhere: kept.
        let fresh = dir.path().join(format!(".m.tmp-{}", dead + 1));
        std::fs::create_dir(&fresh).unwrap();
        let long_ago = std::time::SystemTime::now() - STALE_AFTER - std::time::Duration::from_secs(60);
        for p in [&shard, &stale] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .or_else(|_| std::fs::File::open(p))
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        let live = dir.path().join(".m.tmp-1");
        std::fs::create_dir(&live).unwrap();
        let other = dir.path().join(".n.tmp-12");
        std::fs::write(&other, b"x").unwrap();
        let mut w = SafetensorsWriter::create(&out, plan(), WriteOptions::default()).unwrap();
        assert!(!stale.exists(), "the dead process's shards are gone");
        assert!(live.exists() && other.exists() && fresh.exists());
        w.write_f32("a", &[0.; 6]).unwrap();
    }

    #[test]
    fn a_checkpoint_larger_than_the_free_space_is_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("huge");
        // 2^50 f32 values = 4.5 PB: more than any filesystem here has free
        let plan = vec![PlannedTensor { name: "w".into(), dtype: DType::F32, shape: vec![1 << 50] }];
        let e = SafetensorsWriter::create(&out, plan, WriteOptions::default()).err().unwrap().to_string();
        assert!(e.contains("needs 4503599.63 GB") && e.contains("GB free") && e.contains("huge"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing created");
    }
}
