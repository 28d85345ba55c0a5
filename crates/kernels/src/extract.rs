//! Hashing, atomic verified writes, and reading members out of a `.deb`.

use std::io::{BufReader, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use kloop_path_io::{PathIo, PathIoExt};
use sha2::{Digest, Sha256};

use crate::error::KernelError;

/// sha256 of a file, lowercase hex. Every trial verifies its kernel
/// image (and modules) before booting and keys its saved VM by the kernel
/// it boots: remembered per process for the file's identity, a warm
/// matrix hashes each file once instead of ~40 times (~1.5 s of host CPU
/// over 200 trials).
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let identity = FileIdentity::of(&file.metadata()?, std::time::SystemTime::now());
    if let Some(sha) = identity
        .as_ref()
        .and_then(|id| lock_memo().get(id).cloned())
    {
        return Ok(sha);
    }
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    let sha = hex::encode(hasher.finalize());
    if let Some(id) = identity {
        lock_memo().insert(id, sha.clone());
    }
    Ok(sha)
}

/// What names one version of a file's bytes: the same inode with the same
/// length, modification and change times. Any write moves the change time
/// (and a rename in replaces the inode), so a file rewritten later hashes
/// afresh.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// How recent a change may be and still be trusted by identity: file
/// times tick in clock steps (ext4's coarse clock: a jiffy), so a rewrite
/// of the same length within one step of the first write could keep both
/// times. Files changed in the last two seconds are hashed every time, as
/// git re-reads "racily clean" files.
const SETTLED: std::time::Duration = std::time::Duration::from_secs(2);

impl FileIdentity {
    /// `None` for a file changed too recently before `now` to be
    /// remembered.
    fn of(meta: &std::fs::Metadata, now: std::time::SystemTime) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let ctime = std::time::UNIX_EPOCH
            + std::time::Duration::new(
                u64::try_from(meta.ctime()).ok()?,
                u32::try_from(meta.ctime_nsec()).ok()?,
            );
        let settled = now
            .duration_since(ctime.max(meta.modified().ok()?))
            .is_ok_and(|age| age >= SETTLED);
        settled.then(|| FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

fn lock_memo() -> std::sync::MutexGuard<'static, std::collections::HashMap<FileIdentity, String>> {
    static MEMO: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<FileIdentity, String>>,
    > = std::sync::OnceLock::new();
    MEMO.get_or_init(Default::default)
        .lock()
        // Every change is one insert: a panicking holder leaves it whole.
        .unwrap_or_else(|e| e.into_inner())
}

/// Why [`install_verified`] did not install.
#[derive(Debug)]
pub(crate) enum InstallError {
    /// Reading the source failed.
    Read(std::io::Error),
    /// Writing into the destination directory failed (path named).
    Write(PathIo),
    /// The bytes did not hash to the expected value; nothing was installed.
    Mismatch { actual: String },
}

/// Streams `src` into a temp file in `dir`, hashing as it goes, and renames
/// it to `dir/<name>` only if the hash matches `expected` (any hash if
/// `None`; `name` defaults to the hash). On any error the temp file is
/// removed, so a half-written file never appears under its final name.
/// Returns the final path and the sha256.
pub(crate) fn install_verified(
    mut src: impl Read,
    dir: &Path,
    name: Option<&str>,
    expected: Option<&str>,
) -> Result<(PathBuf, String), InstallError> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(dir)
        .at("creating a temporary file in", dir)
        .map_err(InstallError::Write)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(InstallError::Read(e)),
        };
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n])
            .at("writing", tmp.path())
            .map_err(InstallError::Write)?;
    }
    let actual = hex::encode(hasher.finalize());
    if let Some(expected) = expected {
        if expected != actual {
            return Err(InstallError::Mismatch { actual });
        }
    }
    // Readable like the packages apt writes (temp files start out 0600), so
    // a VM runner under another uid can use a shared cache.
    {
        use std::os::unix::fs::PermissionsExt;
        let f = tmp.as_file();
        f.set_permissions(std::fs::Permissions::from_mode(0o644))
            .and_then(|()| f.sync_all())
            .at("writing", tmp.path())
            .map_err(InstallError::Write)?;
    }
    let dest = dir.join(name.unwrap_or(&actual));
    tmp.persist(&dest)
        .map_err(|e| e.error)
        .at("renaming into", &dest)
        .map_err(InstallError::Write)?;
    Ok((dest, actual))
}

/// Normalises an archive entry path (`./boot/x` → `boot/x`). `Err` if it is
/// absolute or has `..`; `Ok(None)` for the archive root (`./`).
pub(crate) fn normalise_entry_path(path: &Path) -> Result<Option<PathBuf>, ()> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(()),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Walks every entry of a tar stream, refusing any whose path escapes, and
/// hands the others, with their normalised path, to `visit`. The whole
/// stream is read, so every entry path is checked.
pub(crate) fn walk_tar<R: Read>(
    tar: R,
    archive: &Path,
    mut visit: impl FnMut(&Path, &mut tar::Entry<'_, R>) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    let bad = |e: std::io::Error| KernelError::BadImage {
        path: archive.to_path_buf(),
        reason: format!("unreadable package data: {e}"),
    };
    let mut archive_reader = tar::Archive::new(tar);
    for entry in archive_reader.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let raw = entry.path().map_err(bad)?.into_owned();
        let path = match normalise_entry_path(&raw) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(()) => {
                return Err(KernelError::PathEscape {
                    archive: archive.to_path_buf(),
                    entry: raw.display().to_string(),
                })
            }
        };
        visit(&path, &mut entry)?;
    }
    Ok(())
}

/// True for the places Debian puts a kernel image: `boot/vmlinuz-<release>`
/// (up to 6.x) and `usr/lib/modules/<release>/vmlinuz` (7.x `linux-binary-*`).
pub(crate) fn image_release_from_path(path: &Path) -> Option<String> {
    let s = path.to_str()?;
    if let Some(rel) = s.strip_prefix("boot/vmlinuz-") {
        return (!rel.is_empty() && !rel.contains('/')).then(|| rel.to_string());
    }
    let rel = s
        .strip_prefix("usr/lib/modules/")?
        .strip_suffix("/vmlinuz")?;
    (!rel.is_empty() && !rel.contains('/')).then(|| rel.to_string())
}

/// Runs `dpkg-deb --fsys-tarfile <deb>` and walks its output with
/// [`walk_tar`]. The argv is passed directly, never through a shell.
pub(crate) fn walk_deb(
    deb: &Path,
    visit: impl FnMut(
        &Path,
        &mut tar::Entry<'_, BufReader<std::process::ChildStdout>>,
    ) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    let mut child = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("LC_ALL", "C")
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                KernelError::ToolMissing {
                    tool: "dpkg-deb",
                    package: "dpkg",
                }
            } else {
                KernelError::ToolFailed {
                    command: format!("dpkg-deb --fsys-tarfile {}", deb.display()),
                    status: "could not start".into(),
                    stderr: e.to_string(),
                    hint: "check that dpkg-deb runs on this host",
                }
            }
        })?;
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let walked = walk_tar(stdout, deb, visit);
    if walked.is_err() {
        // Stop decompressing; the result is already decided.
        let _ = child.kill();
    }
    let status = child.wait();
    let stderr = stderr_reader.join().unwrap_or_default();
    walked?;
    let status = status.map_err(|e| KernelError::ToolFailed {
        command: format!("dpkg-deb --fsys-tarfile {}", deb.display()),
        status: "wait failed".into(),
        stderr: e.to_string(),
        hint: "run the command again",
    })?;
    if !status.success() {
        return Err(KernelError::ToolFailed {
            command: format!("dpkg-deb --fsys-tarfile {}", deb.display()),
            status: status.to_string(),
            stderr: stderr.trim().to_string(),
            hint: "the package is damaged: delete it from the cache so it is downloaded again",
        });
    }
    Ok(())
}

/// The `uname -r` a bzImage will report, read from its setup header
/// (`HdrS` at 0x202, `kernel_version` pointer at 0x20E, string at +0x200).
pub fn image_release(image: &Path, arch: kloop_protocol::Arch) -> Result<String, KernelError> {
    match arch {
        kloop_protocol::Arch::X86_64 => bzimage_release(image),
        kloop_protocol::Arch::Arm64 => arm64_image_release(image),
    }
}

/// The offset of an arm64 `Image`'s magic, `ARM\x64`
/// (Documentation/arch/arm64/booting.rst: `u32 magic2` at 56).
const ARM64_MAGIC_AT: usize = 0x38;

/// True for an uncompressed arm64 `Image`, which QEMU's `-kernel` boots
/// without firmware (an EFI zboot image, `zimg` at 4, needs UEFI).
pub fn is_arm64_image(head: &[u8]) -> bool {
    head.get(ARM64_MAGIC_AT..ARM64_MAGIC_AT + 4) == Some(b"ARM\x64")
}

/// [`is_arm64_image`] of a file (its first 64 bytes): false when it cannot
/// be read.
pub fn is_arm64_image_file(path: &Path) -> bool {
    let mut head = [0u8; 64];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok()
        && is_arm64_image(&head)
}

/// The release of an uncompressed arm64 `Image`: the first word after the
/// `Linux version ` banner linux_banner (init/version.c) carries; the image
/// has no setup header that points at it.
pub fn arm64_image_release(image: &Path) -> Result<String, KernelError> {
    let bad = |reason: String| KernelError::BadImage {
        path: image.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(image).map_err(|e| bad(format!("cannot read: {e}")))?;
    if bytes.get(4..8) == Some(b"zimg") {
        return Err(bad(
            "an EFI zboot image (compressed, `zimg`): QEMU's -kernel boots arm64 images \
             uncompressed only"
                .into(),
        ));
    }
    if !is_arm64_image(&bytes) {
        return Err(bad("no arm64 Image header (`ARM\\x64` at 0x38)".into()));
    }
    const BANNER: &[u8] = b"Linux version ";
    let at = bytes
        .windows(BANNER.len())
        .position(|w| w == BANNER)
        .ok_or_else(|| bad("no `Linux version` banner in the image".into()))?;
    let rest = &bytes[at + BANNER.len()..];
    let end = rest
        .iter()
        .position(|&c| c == b' ' || c == 0)
        .ok_or_else(|| bad("the banner's release is not terminated".into()))?;
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

pub fn bzimage_release(image: &Path) -> Result<String, KernelError> {
    let bad = |reason: String| KernelError::BadImage {
        path: image.to_path_buf(),
        reason,
    };
    let mut head = Vec::with_capacity(0x10000);
    std::fs::File::open(image)
        .map_err(|e| bad(format!("cannot open: {e}")))?
        .take(0x10000)
        .read_to_end(&mut head)
        .map_err(|e| bad(format!("cannot read: {e}")))?;
    if head.len() < 0x210 || &head[0x202..0x206] != b"HdrS" {
        return Err(bad("no Linux boot-protocol header (`HdrS` at 0x202)".into()));
    }
    let ptr = u16::from_le_bytes([head[0x20E], head[0x20F]]) as usize;
    if ptr == 0 {
        return Err(bad("the setup header has no kernel_version string".into()));
    }
    let start = ptr + 0x200;
    let text = head
        .get(start..)
        .ok_or_else(|| bad("kernel_version points past the setup code".into()))?;
    let end = text
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| bad("kernel_version string is not terminated".into()))?;
    let text = String::from_utf8_lossy(&text[..end]);
    text.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| bad("kernel_version string is empty".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn sha(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// A file just written is hashed on every call, so a same-length
    /// rewrite within the file clock's step is seen; once settled, its
    /// identity stands for its hash, and a replaced file has another.
    #[test]
    fn hashes_are_remembered_only_for_settled_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, b"first").unwrap();
        assert_eq!(sha256_file(&path).unwrap(), sha(b"first"));
        std::fs::write(&path, b"other").unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            sha(b"other"),
            "not remembered: too fresh"
        );

        let meta = std::fs::metadata(&path).unwrap();
        let now = std::time::SystemTime::now();
        assert_eq!(FileIdentity::of(&meta, now), None);
        let later = FileIdentity::of(&meta, now + SETTLED).expect("settled by then");
        assert_eq!(later.len, 5);
        // How the cache replaces a file: a new one renamed into place.
        let replacement = dir.path().join("image.new");
        std::fs::write(&replacement, b"third").unwrap();
        std::fs::rename(&replacement, &path).unwrap();
        let replaced = std::fs::metadata(&path).unwrap();
        assert_ne!(
            FileIdentity::of(&replaced, now + SETTLED * 2),
            Some(later),
            "another inode"
        );
    }

    /// A reader that yields some bytes and then fails, like a dying pipe or
    /// a full disk on the other side.
    struct FailAfter(Vec<u8>);
    impl Read for FailAfter {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Err(std::io::Error::other("stream broke"));
            }
            let n = buf.len().min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn install_writes_only_verified_bytes_under_the_final_name() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![7u8; 200_000];
        let (path, hash) =
            install_verified(&data[..], dir.path(), None, Some(&sha(&data))).unwrap();
        assert_eq!(hash, sha(&data));
        assert_eq!(path, dir.path().join(&hash));
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(files_in(dir.path()), [hash]);
    }

    #[test]
    fn failed_or_mismatched_install_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![1u8; 300_000];
        let err = install_verified(
            FailAfter(data.clone()),
            dir.path(),
            Some("image"),
            Some(&sha(&data)),
        )
        .unwrap_err();
        assert!(matches!(err, InstallError::Read(_)), "{err:?}");
        assert!(
            files_in(dir.path()).is_empty(),
            "{:?}",
            files_in(dir.path())
        );

        let err = install_verified(&data[..], dir.path(), Some("image"), Some(&"0".repeat(64)))
            .unwrap_err();
        let InstallError::Mismatch { actual } = err else {
            panic!("expected a mismatch, got {err:?}");
        };
        assert_eq!(actual, sha(&data));
        assert!(
            files_in(dir.path()).is_empty(),
            "{:?}",
            files_in(dir.path())
        );
    }

    #[test]
    fn install_into_missing_dir_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = install_verified(&b"x"[..], &missing, None, None).unwrap_err();
        let InstallError::Write(e) = err else {
            panic!("expected a write error, got {err:?}");
        };
        assert_eq!(e.path.as_deref(), Some(missing.as_path()));
    }

    /// Builds a tar with raw header names, bypassing the `tar` crate's own
    /// refusal to write `..` or absolute names, the way a hostile package would.
    fn tar_with(names: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for name in names {
            let mut header = tar::Header::new_old();
            let field = &mut header.as_old_mut().name;
            field[..name.len()].copy_from_slice(name.as_bytes());
            header.set_size(4);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_cksum();
            out.extend_from_slice(header.as_bytes());
            let mut block = [0u8; 512];
            block[..4].copy_from_slice(b"data");
            out.extend_from_slice(&block);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn walk_refuses_escaping_paths() {
        for bad in ["./boot/../../etc/passwd", "/boot/vmlinuz-x", "../vmlinuz"] {
            let tar = tar_with(&["./boot/", "./boot/vmlinuz-6.1.0-1-cloud-amd64", bad]);
            let mut seen = Vec::new();
            let err = walk_tar(&tar[..], Path::new("x.deb"), |p, _| {
                seen.push(p.to_path_buf());
                Ok(())
            })
            .unwrap_err();
            let KernelError::PathEscape { entry, archive } = &err else {
                panic!("expected PathEscape for {bad}, got {err:?}");
            };
            assert_eq!(entry, bad);
            assert_eq!(archive, Path::new("x.deb"));
            // The good entries before it were normalised.
            assert_eq!(
                seen,
                [
                    PathBuf::from("boot"),
                    PathBuf::from("boot/vmlinuz-6.1.0-1-cloud-amd64")
                ]
            );
        }
    }

    #[test]
    fn walk_reads_members() {
        let tar = tar_with(&["./", "./usr/lib/modules/7.2.13+deb14-cloud-amd64/vmlinuz"]);
        let mut got = Vec::new();
        walk_tar(&tar[..], Path::new("x.deb"), |p, e| {
            let mut s = String::new();
            e.read_to_string(&mut s).unwrap();
            got.push((p.to_path_buf(), s));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            got,
            [(
                PathBuf::from("usr/lib/modules/7.2.13+deb14-cloud-amd64/vmlinuz"),
                "data".to_string()
            )]
        );
        assert_eq!(
            image_release_from_path(&got[0].0).as_deref(),
            Some("7.2.13+deb14-cloud-amd64")
        );
        assert_eq!(
            image_release_from_path(Path::new("boot/vmlinuz-6.1.0-50-cloud-amd64")).as_deref(),
            Some("6.1.0-50-cloud-amd64")
        );
        assert_eq!(
            image_release_from_path(Path::new("boot/config-6.1.0-50-cloud-amd64")),
            None
        );
    }

    /// Synthetic heads in the layout of Documentation/arch/arm64/booting.rst
    /// (`ARM\x64` at 56) with a linux_banner after them.
    #[test]
    fn arm64_image_release_reads_the_banner_and_refuses_zboot() {
        let dir = tempfile::tempdir().unwrap();
        let mut image = vec![0u8; 64];
        image[ARM64_MAGIC_AT..ARM64_MAGIC_AT + 4].copy_from_slice(b"ARM\x64");
        image.extend_from_slice(
            b"\0Linux version 6.1.0-50-cloud-arm64 (debian-kernel@lists) #1 SMP\0",
        );
        let path = dir.path().join("Image");
        std::fs::write(&path, &image).unwrap();
        assert!(is_arm64_image_file(&path));
        assert_eq!(arm64_image_release(&path).unwrap(), "6.1.0-50-cloud-arm64");
        let mut zboot = image.clone();
        zboot[4..8].copy_from_slice(b"zimg");
        std::fs::write(&path, &zboot).unwrap();
        let err = arm64_image_release(&path).unwrap_err().to_string();
        assert!(err.contains("zboot"), "{err}");
        std::fs::write(
            &path,
            b"not a kernel at all, and long enough to have a head of 64 bytes..",
        )
        .unwrap();
        assert!(!is_arm64_image_file(&path));
        assert!(arm64_image_release(&path).is_err());
    }

    #[test]
    fn bzimage_release_reads_the_setup_header() {
        let dir = tempfile::tempdir().unwrap();
        let mut image = vec![0u8; 0x4000];
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x20E..0x210].copy_from_slice(&0x3000u16.to_le_bytes());
        let s = b"6.1.0-50-cloud-amd64 (builder@build.example) #1 SMP\0";
        image[0x3200..0x3200 + s.len()].copy_from_slice(s);
        let path = dir.path().join("bz");
        std::fs::write(&path, &image).unwrap();
        assert_eq!(bzimage_release(&path).unwrap(), "6.1.0-50-cloud-amd64");

        std::fs::write(&path, vec![0u8; 0x4000]).unwrap();
        assert!(matches!(
            bzimage_release(&path),
            Err(KernelError::BadImage { .. })
        ));
    }
}
