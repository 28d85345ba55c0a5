//! The guest's initramfs: an uncompressed newc cpio archive.
//!
//! Uncompressed on purpose: under TCG, copying a few MiB is cheaper than
//! decompressing them, and every kernel accepts a plain newc archive.

use std::io::{self, Cursor, Write};
use std::path::Path;

use cpio::newc::{Builder, ModeFileType};

/// One entry of the archive.
#[derive(Debug, Clone)]
pub enum Entry {
    Dir {
        path: String,
    },
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    CharDev {
        path: String,
        major: u32,
        minor: u32,
    },
    /// A symbolic link to `target` (busybox's applets, `kloop-run`).
    Symlink {
        path: String,
        target: String,
    },
}

/// An initramfs under construction.
#[derive(Debug, Default, Clone)]
pub struct Initramfs {
    entries: Vec<Entry>,
}

impl Initramfs {
    /// The skeleton every kloop guest needs: mount points and a console node
    /// (the kernel opens /dev/console for PID 1 before devtmpfs is mounted).
    pub fn skeleton() -> Self {
        let mut i = Initramfs::default();
        for d in ["dev", "proc", "sys", "tmp", "kloop"] {
            i.entries.push(Entry::Dir { path: d.into() });
        }
        i.entries.push(Entry::CharDev {
            path: "dev/console".into(),
            major: 5,
            minor: 1,
        });
        i
    }

    pub fn add_file(&mut self, path: &str, mode: u32, data: Vec<u8>) -> &mut Self {
        self.entries.push(Entry::File {
            path: path.trim_start_matches('/').into(),
            mode,
            data,
        });
        self
    }

    /// Adds directory `path` unless the archive already has it; the kernel's
    /// unpacker creates no parents, so add it before the files in it.
    pub fn add_dir(&mut self, path: &str) -> &mut Self {
        let path = path.trim_start_matches('/');
        let exists = self
            .entries
            .iter()
            .any(|e| matches!(e, Entry::Dir { path: p } if p == path));
        if !exists {
            self.entries.push(Entry::Dir { path: path.into() });
        }
        self
    }

    /// Adds a symbolic link `path` → `target`.
    pub fn add_symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entries.push(Entry::Symlink {
            path: path.trim_start_matches('/').into(),
            target: target.into(),
        });
        self
    }

    /// Whether the archive has an entry at `path`.
    pub fn contains(&self, path: &str) -> bool {
        let path = path.trim_start_matches('/');
        self.entries.iter().any(|e| match e {
            Entry::Dir { path: p }
            | Entry::File { path: p, .. }
            | Entry::CharDev { path: p, .. }
            | Entry::Symlink { path: p, .. } => p == path,
        })
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Writes the archive.
    pub fn write_to<W: Write>(&self, mut out: W) -> io::Result<W> {
        for (ino, e) in self.entries.iter().enumerate() {
            let ino = ino as u32 + 1;
            out = match e {
                Entry::Dir { path } => {
                    let b = Builder::new(path)
                        .ino(ino)
                        .mode(0o755)
                        .nlink(2)
                        .set_mode_file_type(ModeFileType::Directory);
                    b.write(out, 0).finish()?
                }
                Entry::File { path, mode, data } => {
                    let size = u32::try_from(data.len()).map_err(|_| {
                        io::Error::new(io::ErrorKind::InvalidInput, format!("{path} is over 4 GiB"))
                    })?;
                    let b = Builder::new(path)
                        .ino(ino)
                        .mode(*mode)
                        .nlink(1)
                        .set_mode_file_type(ModeFileType::Regular);
                    let mut w = b.write(out, size);
                    io::copy(&mut Cursor::new(data), &mut w)?;
                    w.finish()?
                }
                Entry::CharDev { path, major, minor } => {
                    let b = Builder::new(path)
                        .ino(ino)
                        .mode(0o600)
                        .nlink(1)
                        .rdev_major(*major)
                        .rdev_minor(*minor)
                        .set_mode_file_type(ModeFileType::Char);
                    b.write(out, 0).finish()?
                }
                Entry::Symlink { path, target } => {
                    // newc stores a link's target as its data.
                    let b = Builder::new(path)
                        .ino(ino)
                        .mode(0o777)
                        .nlink(1)
                        .set_mode_file_type(ModeFileType::Symlink);
                    let mut w = b.write(out, target.len() as u32);
                    w.write_all(target.as_bytes())?;
                    w.finish()?
                }
            };
        }
        cpio::newc::trailer(out)
    }

    /// Writes the archive to `path` atomically.
    pub fn write_file(&self, path: &Path) -> io::Result<u64> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        let w = self.write_to(io::BufWriter::new(tmp.as_file_mut()))?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all().ok();
        let len = tmp.as_file().metadata()?.len();
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_reads_back_with_modes_and_device() {
        let mut i = Initramfs::skeleton();
        i.add_file("/init", 0o755, b"\x7fELF-ish".to_vec());
        i.add_file("kloop/plan.json", 0o644, b"{}".to_vec());
        i.add_symlink("/bin/sh", "busybox");
        let bytes = i.write_to(Vec::new()).unwrap();
        let mut seen = Vec::new();
        let mut cur = Cursor::new(bytes);
        loop {
            let r = cpio::newc::Reader::new(cur).unwrap();
            if r.entry().is_trailer() {
                break;
            }
            let e = r.entry();
            seen.push((
                e.name().to_string(),
                e.mode(),
                e.rdev_major(),
                e.file_size(),
            ));
            cur = r.finish().unwrap();
        }
        assert!(seen.contains(&("init".into(), 0o100755, 0, 8)));
        assert!(seen.contains(&("kloop/plan.json".into(), 0o100644, 0, 2)));
        assert!(seen.contains(&("dev/console".into(), 0o020600, 5, 0)));
        assert!(seen.contains(&("proc".into(), 0o040755, 0, 0)));
        assert!(seen.contains(&("bin/sh".into(), 0o120777, 0, 7)));
    }
}
