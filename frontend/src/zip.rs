//! A checkpoint's files as one `.zip` archive (method 0, "stored": the
//! weights do not compress), so a download is one file named after the
//! checkpoint that unpacks into a folder `NAME/` holding `model.safetensors`,
//! `config.json`, ... — what `transformers` or the CLI load.
//!
//! Format: PKWARE APPNOTE.TXT 6.3.x, §4.3 (local file headers, central
//! directory, end of central directory record). No ZIP64: a tab's files
//! are below 4 GiB (wasm32), and larger ones are refused. Names are UTF-8
//! (general purpose flag bit 11). The archive is built as a list of parts
//! (headers, then each file's bytes as they are) so the browser never holds
//! a second copy of the weights in wasm memory.

/// One piece of the archive: bytes written here, or file `i`'s contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Header bytes.
    Bytes(Vec<u8>),
    /// The contents of file `i` of the input, unchanged.
    File(usize),
}

/// DOS date of 1980-01-01 (the earliest the format has; no clock is read,
/// so the same checkpoint always gives the same archive).
const DOS_DATE: u16 = (1 << 5) | 1;

fn u16le(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn u32le(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}

/// The parts of a stored archive of `files` (`(name, bytes)`) under the
/// folder `folder/`.
///
/// # Errors
/// A file or the whole archive of 4 GiB or more, or more than 65,535 files.
pub fn stored_zip(folder: &str, files: &[(&str, &[u8])]) -> Result<Vec<Part>, String> {
    if files.len() > u16::MAX as usize {
        return Err(format!("{} files do not fit a zip archive without ZIP64", files.len()));
    }
    let mut parts = Vec::new();
    let mut central = Vec::new();
    let mut offset: u64 = 0;
    for (i, (name, bytes)) in files.iter().enumerate() {
        let path = format!("{folder}/{name}");
        let size = u32::try_from(bytes.len()).map_err(|_| format!("{path} is 4 GiB or more (no ZIP64 here)"))?;
        let crc = crc32fast::hash(bytes);
        let off =
            u32::try_from(offset).map_err(|_| "the archive would be 4 GiB or more (no ZIP64 here)".to_string())?;
        let mut h = Vec::with_capacity(30 + path.len());
        u32le(&mut h, 0x0403_4b50);
        u16le(&mut h, 20); // version needed: 2.0
        u16le(&mut h, 1 << 11); // UTF-8 names
        u16le(&mut h, 0); // stored
        u16le(&mut h, 0); // time
        u16le(&mut h, DOS_DATE);
        u32le(&mut h, crc);
        u32le(&mut h, size);
        u32le(&mut h, size);
        u16le(&mut h, path.len() as u16);
        u16le(&mut h, 0); // extra
        h.extend_from_slice(path.as_bytes());
        offset += h.len() as u64 + u64::from(size);
        parts.push(Part::Bytes(h));
        parts.push(Part::File(i));
        u32le(&mut central, 0x0201_4b50);
        u16le(&mut central, 20); // made by: 2.0, MS-DOS attributes
        u16le(&mut central, 20);
        u16le(&mut central, 1 << 11);
        u16le(&mut central, 0);
        u16le(&mut central, 0);
        u16le(&mut central, DOS_DATE);
        u32le(&mut central, crc);
        u32le(&mut central, size);
        u32le(&mut central, size);
        u16le(&mut central, path.len() as u16);
        u16le(&mut central, 0); // extra
        u16le(&mut central, 0); // comment
        u16le(&mut central, 0); // disk
        u16le(&mut central, 0); // internal attributes
        u32le(&mut central, 0); // external attributes
        u32le(&mut central, off);
        central.extend_from_slice(path.as_bytes());
    }
    let cd_offset =
        u32::try_from(offset).map_err(|_| "the archive would be 4 GiB or more (no ZIP64 here)".to_string())?;
    let mut end = central;
    let cd_size = end.len() as u32;
    u32le(&mut end, 0x0605_4b50);
    u16le(&mut end, 0);
    u16le(&mut end, 0);
    u16le(&mut end, files.len() as u16);
    u16le(&mut end, files.len() as u16);
    u32le(&mut end, cd_size);
    u32le(&mut end, cd_offset);
    u16le(&mut end, 0); // comment
    parts.push(Part::Bytes(end));
    Ok(parts)
}

/// The archive's bytes in one buffer (tests and native use).
pub fn assemble(parts: &[Part], files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        match p {
            Part::Bytes(b) => out.extend_from_slice(b),
            Part::File(i) => out.extend_from_slice(files[*i].1),
        }
    }
    out
}

/// The archive as a `Blob` (the file bytes go from wasm memory straight into
/// the Blob).
///
/// # Errors
/// As [`stored_zip`], or the browser's refusal.
#[cfg(target_arch = "wasm32")]
pub fn stored_zip_blob(folder: &str, files: &[(&str, &[u8])]) -> Result<web_sys::Blob, String> {
    let parts = stored_zip(folder, files)?;
    // Every header is copied into JavaScript first; then the file views are
    // made and handed to the Blob constructor with no Rust allocation in
    // between (an allocation could move wasm memory under a view).
    let headers: Vec<Option<js_sys::Uint8Array>> = parts
        .iter()
        .map(|p| match p {
            Part::Bytes(b) => Some(js_sys::Uint8Array::from(b.as_slice())),
            Part::File(_) => None,
        })
        .collect();
    let arr = js_sys::Array::new_with_length(parts.len() as u32);
    for (k, (p, h)) in parts.iter().zip(&headers).enumerate() {
        match (p, h) {
            (_, Some(h)) => arr.set(k as u32, h.into()),
            (Part::File(i), None) => {
                // SAFETY: read by the Blob constructor below before any
                // allocation (see above).
                let view = unsafe { js_sys::Uint8Array::view(files[*i].1) };
                arr.set(k as u32, view.into());
            }
            (Part::Bytes(_), None) => unreachable!("every header was copied"),
        }
    }
    crate::web::blob_of(&arr)
}

/// Native builds have no `Blob`.
///
/// # Errors
/// Always.
#[cfg(not(target_arch = "wasm32"))]
pub fn stored_zip_blob(_folder: &str, _files: &[(&str, &[u8])]) -> Result<web_sys::Blob, String> {
    Err("archives are made in the browser".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zip_crate_reads_our_archive() {
        let weights: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let files: Vec<(&str, &[u8])> =
            vec![("model.safetensors", &weights), ("config.json", b"{\"a\": 1}\n"), ("tokenizer.json", b"")];
        let parts = stored_zip("stories260K-upcycled-2x", &files).unwrap();
        let bytes = assemble(&parts, &files);
        let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
        assert_eq!(z.len(), 3);
        for (name, want) in &files {
            let mut f = z.by_name(&format!("stories260K-upcycled-2x/{name}")).unwrap();
            assert_eq!(f.compression(), zip::CompressionMethod::Stored);
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut got).unwrap();
            assert_eq!(&got, want, "{name}");
        }
        // Built twice: the same bytes (no clock).
        assert_eq!(
            assemble(&stored_zip("x", &files).unwrap(), &files),
            assemble(&stored_zip("x", &files).unwrap(), &files)
        );
    }
}
