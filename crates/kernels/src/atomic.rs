//! Files other kloop processes may read while this one writes them.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same
/// directory (created if missing), synced and renamed over `path`: a
/// reader sees the old file or the whole new one, never half, and two
/// writers never share a temporary file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".kloop-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The file holds the new bytes, no temporary file is left beside it,
    /// and a missing directory is made.
    #[test]
    fn replaces_whole_and_leaves_nothing_beside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/report.json");
        super::write_atomically(&path, b"old").unwrap();
        super::write_atomically(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["report.json"]);
    }
}
