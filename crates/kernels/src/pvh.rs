//! Booting a bzImage's own kernel through its PVH entry point.
//!
//! A bzImage is a real-mode setup stub, a decompressor and the compressed
//! `vmlinux` ELF. Under TCG, SeaBIOS's real-mode boot and the in-guest
//! decompression cost about half a second per boot (QEMU CPU time to the
//! agent's hello on 6.1: 2.83 s as a bzImage, 2.35 s as PVH, four boots
//! each). Kernels built with `CONFIG_PVH` (every Debian pin) carry an ELF
//! note `XEN_ELFNOTE_PHYS32_ENTRY`, and QEMU's `-kernel` boots such an ELF
//! directly. So kloop decompresses the payload of the *verified* bzImage
//! once on the host and caches the ELF next to the image, keyed by the
//! image's sha256: the same kernel build, entered without the decompressor.
//!
//! What changes for the guest: no decompressor means no KASLR (the
//! decompressor picks the random base), so the kernel and its module/JIT
//! area sit at the same addresses on every boot. kloop normalises addresses
//! anyway; the `overhead` scenario asks for `nokaslr` either way.

use std::io::Read;
use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};
use sha2::{Digest, Sha256};

/// `XEN_ELFNOTE_PHYS32_ENTRY` (include/xen/interface/elfnote.h).
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// The lz4 "legacy" container the kernel's `lz4 -l` build writes.
const LZ4_LEGACY_MAGIC: [u8; 4] = [0x02, 0x21, 0x4c, 0x18];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// An ELF larger than this is not a kernel (guards the size trailer).
const MAX_VMLINUX: usize = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum PvhError {
    #[error("{path}: {reason}")]
    Image { path: PathBuf, reason: String },
    #[error("the payload of {path} is compressed with {format}, which kloop does not decompress")]
    Unsupported { path: PathBuf, format: String },
    #[error("{path}: the decompressed kernel has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY; CONFIG_PVH off?)")]
    NoPvhEntry { path: PathBuf },
    #[error(transparent)]
    Io(#[from] PathIo),
}

/// The PVH-bootable ELF of `image`, from `<cache_root>/vmlinux/` or made
/// there now. Keyed by the image's sha256, so a changed image never meets
/// a stale ELF. `image_sha256` is the image's hash when the caller has just
/// verified it (a pin's cached image), which spares hashing it again.
pub fn ensure_pvh(
    cache_root: &Path,
    image: &Path,
    image_sha256: Option<&str>,
) -> Result<PathBuf, PvhError> {
    let bad = |reason: String| PvhError::Image {
        path: image.to_path_buf(),
        reason,
    };
    let dir = cache_root.join("vmlinux");
    if let Some(sha) = image_sha256 {
        let dest = dir.join(sha);
        if cached(&dest) {
            return Ok(dest);
        }
    }
    let bytes = std::fs::read(image).map_err(|e| bad(format!("cannot read: {e}")))?;
    let sha = hex::encode(Sha256::digest(&bytes));
    let dest = dir.join(&sha);
    if cached(&dest) {
        return Ok(dest);
    }
    let task = format!("pvh {}", &sha[..12]);
    crate::status::start(
        &task,
        &format!(
            "decompressing {} into an ELF QEMU boots through its PVH entry",
            image.display()
        ),
    );
    let elf = decompress_payload(image, &bytes).inspect_err(|e| {
        crate::status::failed(&task, &e.to_string());
    })?;
    crate::status::done(
        &task,
        &format!(
            "PVH ELF of {} ready ({:.1} MB)",
            image.display(),
            elf.len() as f64 / 1e6
        ),
    );
    if !has_pvh_entry(&elf) {
        return Err(PvhError::NoPvhEntry {
            path: image.to_path_buf(),
        });
    }
    std::fs::create_dir_all(&dir).at("creating", &dir)?;
    let tmp = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(&dir)
        .at("creating a temporary file in", &dir)?;
    std::fs::write(tmp.path(), &elf).at("writing", tmp.path())?;
    {
        use std::os::unix::fs::PermissionsExt;
        let f = tmp.as_file();
        f.set_permissions(std::fs::Permissions::from_mode(0o644))
            .and_then(|()| f.sync_all())
            .at("writing", tmp.path())?;
    }
    tmp.persist(&dest)
        .map_err(|e| e.error)
        .at("renaming into", &dest)?;
    Ok(dest)
}

/// Is a cached PVH ELF there and whole? It is cheap to make again from its
/// image, so one that is not (cut short by a full disk, damaged on disk,
/// left by an older kloop) is removed, said, and remade instead of handed
/// to QEMU, which would fail every trial with "Error while loading elf
/// kernel".
fn cached(dest: &Path) -> bool {
    if !dest.is_file() {
        return false;
    }
    match verify_elf(dest) {
        Ok(()) => true,
        Err(why) => {
            crate::status::done(
                &format!("pvh-check {}", dest.display()),
                &format!(
                    "the cached PVH ELF {} is damaged ({why}): removed, making it again",
                    dest.display()
                ),
            );
            let _ = std::fs::remove_file(dest);
            false
        }
    }
}

/// Why a file is not a PVH ELF QEMU can boot.
#[derive(Debug, thiserror::Error)]
pub enum ElfProblem {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Object(#[from] object::Error),
    #[error("a segment ends at byte {end}, the file has {len} bytes")]
    SegmentPastEnd { end: u64, len: u64 },
    #[error("no PVH entry note")]
    NoPvhNote,
}

/// The ELF's header and program headers read (without reading the whole
/// file): every segment lies inside the file and the PVH entry note is
/// there.
pub fn verify_elf(path: &Path) -> Result<(), ElfProblem> {
    use object::elf::{FileHeader64, PT_LOAD};
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::LittleEndian;

    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let data = object::ReadCache::new(file);
    let header = FileHeader64::<LittleEndian>::parse(&data)?;
    let endian = header.endian()?;
    let headers = header.program_headers(endian, &data)?;
    let mut pvh = false;
    for ph in headers {
        let end = ph.p_offset(endian).saturating_add(ph.p_filesz(endian));
        if end > len {
            return Err(ElfProblem::SegmentPastEnd { end, len });
        }
        if ph.p_type(endian) == PT_LOAD {
            continue;
        }
        if let Ok(Some(mut notes)) = ph.notes(endian, &data) {
            while let Ok(Some(note)) = notes.next() {
                pvh |= note.n_type(endian) == XEN_ELFNOTE_PHYS32_ENTRY
                    && note.name().starts_with(b"Xen");
            }
        }
    }
    if pvh {
        Ok(())
    } else {
        Err(ElfProblem::NoPvhNote)
    }
}

/// The compressed payload of a bzImage (boot protocol 2.08+:
/// `payload_offset` / `payload_length` at 0x248, relative to the
/// protected-mode code after the setup sectors).
fn payload<'a>(image: &Path, bytes: &'a [u8]) -> Result<&'a [u8], PvhError> {
    let bad = |reason: &str| PvhError::Image {
        path: image.to_path_buf(),
        reason: reason.to_string(),
    };
    if bytes.len() < 0x250 || &bytes[0x202..0x206] != b"HdrS" {
        return Err(bad("no Linux boot-protocol header (`HdrS` at 0x202)"));
    }
    let version = u16::from_le_bytes([bytes[0x206], bytes[0x207]]);
    if version < 0x208 {
        return Err(bad(
            "boot protocol older than 2.08 has no payload_offset field",
        ));
    }
    let setup_sects = match bytes[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let le32 = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let start = (setup_sects + 1) * 512 + le32(0x248) as usize;
    let len = le32(0x24c) as usize;
    bytes
        .get(start..start.saturating_add(len))
        .ok_or_else(|| bad("payload_offset/payload_length point past the end of the file"))
}

/// The kernel proper (`vmlinux`) inside the bzImage at `image`, decompressed
/// in memory.
pub fn decompressed_kernel(image: &Path) -> Result<Vec<u8>, PvhError> {
    let bytes = std::fs::read(image).map_err(|e| PvhError::Image {
        path: image.to_path_buf(),
        reason: format!("cannot read: {e}"),
    })?;
    decompress_payload(image, &bytes)
}

fn decompress_payload(image: &Path, bytes: &[u8]) -> Result<Vec<u8>, PvhError> {
    let data = payload(image, bytes)?;
    let bad = |reason: String| PvhError::Image {
        path: image.to_path_buf(),
        reason,
    };
    // The kernel's build appends the decompressed size (le32) to every
    // compressed payload (scripts/Makefile.lib, size_append).
    let expected = data
        .len()
        .checked_sub(4)
        .map(|at| u32::from_le_bytes(data[at..].try_into().expect("4 bytes")) as usize)
        .filter(|n| *n > 0 && *n <= MAX_VMLINUX)
        .ok_or_else(|| bad("payload has no plausible size trailer".into()))?;
    let out = if data.starts_with(&LZ4_LEGACY_MAGIC) {
        lz4_legacy(&data[4..], expected).map_err(bad)?
    } else if data.starts_with(&ZSTD_MAGIC) {
        let mut out = Vec::with_capacity(expected);
        ruzstd::decoding::StreamingDecoder::new(data)
            .map_err(|e| bad(format!("zstd: {e}")))?
            .read_to_end(&mut out)
            .map_err(|e| bad(format!("zstd: {e}")))?;
        out
    } else if data.starts_with(&GZIP_MAGIC) {
        // tinyconfig's default (KERNEL_GZIP): what self-built kernels use.
        let mut out = Vec::with_capacity(expected);
        flate2::read::GzDecoder::new(data)
            .take(MAX_VMLINUX as u64)
            .read_to_end(&mut out)
            .map_err(|e| bad(format!("gzip: {e}")))?;
        out
    } else {
        let format = format!(
            "an unknown format (magic {:02x?})",
            &data[..data.len().min(4)]
        );
        return Err(PvhError::Unsupported {
            path: image.to_path_buf(),
            format,
        });
    };
    if out.len() != expected {
        return Err(bad(format!(
            "decompressed {} bytes but the payload's trailer says {expected}",
            out.len()
        )));
    }
    Ok(out)
}

/// The lz4 legacy container: blocks of `le32 compressed size` + data, each
/// inflating to at most 8 MiB, until `expected` bytes are out (the size
/// trailer follows the last block and must not be read as one).
fn lz4_legacy(mut data: &[u8], expected: usize) -> Result<Vec<u8>, String> {
    const BLOCK: usize = 8 << 20;
    let mut out = Vec::with_capacity(expected);
    while out.len() < expected {
        let Some((size, rest)) = data.split_first_chunk::<4>() else {
            return Err(format!("lz4: stream ends after {} bytes", out.len()));
        };
        let size = u32::from_le_bytes(*size) as usize;
        let block = rest
            .get(..size)
            .ok_or_else(|| format!("lz4: block of {size} bytes runs past the payload"))?;
        let start = out.len();
        out.resize(start + BLOCK.min(expected - start), 0);
        let n = lz4_flex::block::decompress_into(block, &mut out[start..])
            .map_err(|e| format!("lz4: block at output offset {start}: {e}"))?;
        out.truncate(start + n);
        data = &rest[size..];
    }
    Ok(out)
}

/// Whether an ELF64 (little-endian) has a `PT_NOTE` with a Xen note of
/// type `XEN_ELFNOTE_PHYS32_ENTRY`, read with the `object` crate.
pub fn has_pvh_entry(elf: &[u8]) -> bool {
    use object::elf::FileHeader64;
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::LittleEndian;

    let Ok(header) = FileHeader64::<LittleEndian>::parse(elf) else {
        return false;
    };
    let Ok(endian) = header.endian() else {
        return false;
    };
    let Ok(headers) = header.program_headers(endian, elf) else {
        return false;
    };
    headers.iter().any(|ph| {
        let Ok(Some(mut notes)) = ph.notes(endian, elf) else {
            return false;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.n_type(endian) == XEN_ELFNOTE_PHYS32_ENTRY && note.name().starts_with(b"Xen") {
                return true;
            }
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 with one PT_NOTE holding one note of `kind`
    /// (built from the ELF layout, not taken from a kernel).
    fn elf_with_note(name: &[u8], kind: u32) -> Vec<u8> {
        let mut e = vec![0u8; 0x40 + 0x38];
        // Magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT.
        e[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        e[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        e[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        e[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let note_off = e.len();
        let mut note = Vec::new();
        note.extend_from_slice(&(name.len() as u32).to_le_bytes());
        note.extend_from_slice(&4u32.to_le_bytes());
        note.extend_from_slice(&kind.to_le_bytes());
        note.extend_from_slice(name);
        while note.len() % 4 != 0 {
            note.push(0);
        }
        note.extend_from_slice(&0x0100_0000u32.to_le_bytes());
        let ph = 0x40;
        e[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes());
        e[ph + 8..ph + 16].copy_from_slice(&(note_off as u64).to_le_bytes());
        e[ph + 32..ph + 40].copy_from_slice(&(note.len() as u64).to_le_bytes());
        e.extend_from_slice(&note);
        e
    }

    #[test]
    fn finds_the_pvh_note_and_only_it() {
        assert!(has_pvh_entry(&elf_with_note(b"Xen\0", 18)));
        assert!(!has_pvh_entry(&elf_with_note(b"Xen\0", 17)));
        assert!(!has_pvh_entry(&elf_with_note(b"GNU\0", 18)));
        assert!(!has_pvh_entry(b"\x7fELF\x01\x01 32-bit"));
        assert!(!has_pvh_entry(&[]));
    }

    /// A bzImage-shaped file around `payload` (setup header fields only).
    fn bzimage(payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 5 * 512];
        b[0x1f1] = 4;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
        b[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        b[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0xcc; 16]);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn lz4_legacy_payload_round_trips() {
        let elf = elf_with_note(b"Xen\0", 18).repeat(1000);
        let block = lz4_flex::block::compress(&elf);
        let mut payload = LZ4_LEGACY_MAGIC.to_vec();
        payload.extend_from_slice(&(block.len() as u32).to_le_bytes());
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&(elf.len() as u32).to_le_bytes());
        let image = bzimage(&payload);
        let out = decompress_payload(Path::new("bz"), &image).unwrap();
        assert_eq!(out, elf);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bz");
        std::fs::write(&path, &image).unwrap();
        let first = ensure_pvh(dir.path(), &path, None).unwrap();
        assert_eq!(std::fs::read(&first).unwrap(), elf);
        assert_eq!(ensure_pvh(dir.path(), &path, None).unwrap(), first);
        // A caller that verified the image passes its hash: the cached ELF
        // is found without reading the image (gone here) again.
        let sha = first.file_name().unwrap().to_str().unwrap().to_string();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(ensure_pvh(dir.path(), &path, Some(&sha)).unwrap(), first);
        assert!(ensure_pvh(dir.path(), &path, None).is_err());
    }

    /// A cached ELF cut short (a full disk, a crash in an older kloop) is
    /// noticed on use and made again from the image, not handed to QEMU.
    #[test]
    fn a_damaged_cached_elf_is_made_again() {
        let elf = elf_with_note(b"Xen\0", 18);
        let block = lz4_flex::block::compress(&elf);
        let mut payload = LZ4_LEGACY_MAGIC.to_vec();
        payload.extend_from_slice(&(block.len() as u32).to_le_bytes());
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&(elf.len() as u32).to_le_bytes());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bz");
        std::fs::write(&path, bzimage(&payload)).unwrap();
        let cached = ensure_pvh(dir.path(), &path, None).unwrap();
        assert!(verify_elf(&cached).is_ok());
        let sha = cached.file_name().unwrap().to_str().unwrap().to_string();
        std::fs::write(&cached, &elf[..elf.len() - 6]).unwrap();
        let e = verify_elf(&cached).unwrap_err().to_string();
        assert!(e.contains("a segment ends at byte"), "{e}");
        // Found damaged by its hash (the pin's path), remade from the image.
        assert_eq!(ensure_pvh(dir.path(), &path, Some(&sha)).unwrap(), cached);
        assert_eq!(std::fs::read(&cached).unwrap(), elf);
        // Not an ELF at all: the same.
        std::fs::write(&cached, b"garbage").unwrap();
        assert!(verify_elf(&cached).is_err());
        assert_eq!(ensure_pvh(dir.path(), &path, None).unwrap(), cached);
        assert_eq!(std::fs::read(&cached).unwrap(), elf);
        // An ELF without the PVH note is not one QEMU can boot.
        std::fs::write(&cached, elf_with_note(b"Xen\0", 17)).unwrap();
        assert_eq!(
            verify_elf(&cached).unwrap_err().to_string(),
            "no PVH entry note"
        );
    }

    #[test]
    fn wrong_size_trailer_and_unknown_format_are_refused() {
        let elf = elf_with_note(b"Xen\0", 18);
        let block = lz4_flex::block::compress(&elf);
        let mut payload = LZ4_LEGACY_MAGIC.to_vec();
        payload.extend_from_slice(&(block.len() as u32).to_le_bytes());
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&(elf.len() as u32 + 1).to_le_bytes());
        let err = decompress_payload(Path::new("bz"), &bzimage(&payload)).unwrap_err();
        assert!(
            err.to_string().contains("lz4") || err.to_string().contains("trailer"),
            "{err}"
        );

        let err = decompress_payload(Path::new("bz"), &bzimage(b"\x1f\x8b\x08\0....\x10\0\0\0"))
            .unwrap_err();
        assert!(err.to_string().contains("gzip"), "{err}");
        let err = decompress_payload(Path::new("bz"), b"not a kernel").unwrap_err();
        assert!(err.to_string().contains("HdrS"), "{err}");
    }
}
