//! A kernel's build configuration (`.config`): where to find it for any
//! kernel kloop boots, and what it says.
//!
//! Three places, tried in this order by the callers:
//! - a build tree's `.config` (source builds, `--kernel-image` inside a tree);
//! - the Debian package's `/boot/config-<release>` (pins);
//! - the image itself, when built with `CONFIG_IKCONFIG`: `kernel/configs.c`
//!   embeds the gzipped `.config` between the markers `IKCFG_ST` and
//!   `IKCFG_ED` in the kernel proper (inside the bzImage's compressed
//!   payload, so the payload is decompressed first).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use kloop_path_io::PathIoExt;

use crate::error::KernelError;

/// The value of one option as `.config` writes it: `y`, `m`, a number or a
/// quoted string. An option written `# CONFIG_X is not set` is absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    values: BTreeMap<String, String>,
    /// Where it was read from, for messages (`/boot/config-6.12…` in the
    /// package, `…/.config`, `IKCONFIG in …`).
    pub source: String,
}

/// The state of one option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionState<'a> {
    BuiltIn,
    Module,
    /// A number or a string.
    Value(&'a str),
    NotSet,
}

impl KernelConfig {
    /// Parses `.config` text. Lines that are neither assignments nor
    /// comments are ignored, as `scripts/kconfig` does with unknown input.
    pub fn parse(text: &str, source: impl Into<String>) -> KernelConfig {
        let mut values = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            if let Some((name, value)) = line.split_once('=') {
                if name.starts_with("CONFIG_") && !name.contains(char::is_whitespace) {
                    values.insert(name.to_string(), value.to_string());
                }
            }
        }
        KernelConfig {
            values,
            source: source.into(),
        }
    }

    pub fn from_file(path: &Path) -> Result<KernelConfig, KernelError> {
        let text = std::fs::read_to_string(path)
            .doing(format!("reading kernel config {}", path.display()))?;
        Ok(KernelConfig::parse(&text, path.display().to_string()))
    }

    /// `name` with or without its `CONFIG_` prefix.
    pub fn state(&self, name: &str) -> OptionState<'_> {
        let key = if name.starts_with("CONFIG_") {
            name.to_string()
        } else {
            format!("CONFIG_{name}")
        };
        match self.values.get(&key).map(String::as_str) {
            None | Some("n") => OptionState::NotSet,
            Some("y") => OptionState::BuiltIn,
            Some("m") => OptionState::Module,
            Some(v) => OptionState::Value(v),
        }
    }

    /// Built in or a module.
    pub fn is_enabled(&self, name: &str) -> bool {
        matches!(self.state(name), OptionState::BuiltIn | OptionState::Module)
    }

    pub fn is_builtin(&self, name: &str) -> bool {
        self.state(name) == OptionState::BuiltIn
    }

    /// The raw value (`y`, `m`, `"bpf"`, `250`), if set.
    pub fn value(&self, name: &str) -> Option<&str> {
        match self.state(name) {
            OptionState::NotSet => None,
            OptionState::BuiltIn => Some("y"),
            OptionState::Module => Some("m"),
            OptionState::Value(v) => Some(v),
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// A stable hash of the resolved options (sha256 of `NAME=value` lines
    /// in name order): what a build is cached by, independent of comments
    /// and of the order `.config` happens to be written in.
    pub fn content_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for (k, v) in &self.values {
            h.update(k.as_bytes());
            h.update(b"=");
            h.update(v.as_bytes());
            h.update(b"\n");
        }
        hex::encode(h.finalize())
    }
}

const IKCFG_START: &[u8] = b"IKCFG_ST";
const IKCFG_END: &[u8] = b"IKCFG_ED";
/// Larger than any real `.config` gzipped (≈ 60 KiB for a distro kernel).
const MAX_IKCONFIG_GZ: usize = 4 << 20;
const MAX_IKCONFIG_TEXT: u64 = 16 << 20;

/// The `.config` embedded in a kernel proper (`vmlinux` bytes, decompressed),
/// if it was built with `CONFIG_IKCONFIG`.
pub fn ikconfig_from_vmlinux(vmlinux: &[u8], source: &str) -> Option<KernelConfig> {
    let start = find(vmlinux, IKCFG_START)? + IKCFG_START.len();
    let rest = &vmlinux[start..];
    let end = find(&rest[..rest.len().min(MAX_IKCONFIG_GZ)], IKCFG_END)?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(&rest[..end])
        .take(MAX_IKCONFIG_TEXT)
        .read_to_string(&mut text)
        .ok()?;
    Some(KernelConfig::parse(
        &text,
        format!("the IKCONFIG embedded in {source}"),
    ))
}

/// The config a bzImage carries (`CONFIG_IKCONFIG`), or `None`.
pub fn ikconfig_from_image(image: &Path) -> Option<KernelConfig> {
    let bytes = crate::pvh::decompressed_kernel(image).ok()?;
    ikconfig_from_vmlinux(&bytes, &image.display().to_string())
}

/// The `.config` of the tree an image was built in, when `image` sits at
/// `<tree>/arch/<arch>/boot/bzImage` (or `<tree>/vmlinux`) and the tree has
/// one.
pub fn tree_config_for_image(image: &Path) -> Option<PathBuf> {
    let image = image.canonicalize().ok()?;
    let mut dir = image.parent();
    // arch/x86/boot/bzImage → three levels up; vmlinux → one.
    for _ in 0..4 {
        let d = dir?;
        let candidate = d.join(".config");
        if candidate.is_file() && d.join("Makefile").is_file() {
            return Some(candidate);
        }
        dir = d.parent();
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const SAMPLE: &str = "#\n# Automatically generated file; DO NOT EDIT.\n#\nCONFIG_BPF=y\nCONFIG_VETH=m\n# CONFIG_FUTEX is not set\nCONFIG_LSM=\"landlock,bpf\"\nCONFIG_HZ=250\n";

    #[test]
    fn parse_reads_states() {
        let c = KernelConfig::parse(SAMPLE, "sample");
        assert_eq!(c.state("CONFIG_BPF"), OptionState::BuiltIn);
        assert_eq!(c.state("VETH"), OptionState::Module);
        assert_eq!(c.state("FUTEX"), OptionState::NotSet);
        assert_eq!(c.state("NEVER_HEARD_OF"), OptionState::NotSet);
        assert_eq!(c.value("LSM"), Some("\"landlock,bpf\""));
        assert_eq!(c.value("HZ"), Some("250"));
        assert!(c.is_enabled("VETH") && !c.is_builtin("VETH"));
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn content_hash_ignores_comments_and_order() {
        let a = KernelConfig::parse("CONFIG_A=y\n# c\nCONFIG_B=m\n", "a");
        let b = KernelConfig::parse("CONFIG_B=m\nCONFIG_A=y\n", "b");
        let c = KernelConfig::parse("CONFIG_B=y\nCONFIG_A=y\n", "c");
        assert_eq!(a.content_hash(), b.content_hash());
        assert_ne!(a.content_hash(), c.content_hash());
    }

    #[test]
    fn ikconfig_is_found_between_its_markers() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(SAMPLE.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let mut vmlinux = vec![0u8; 1000];
        vmlinux.extend_from_slice(IKCFG_START);
        vmlinux.extend_from_slice(&gz);
        vmlinux.extend_from_slice(IKCFG_END);
        vmlinux.extend_from_slice(&[0u8; 100]);
        let c = ikconfig_from_vmlinux(&vmlinux, "test image").expect("found");
        assert!(c.is_builtin("BPF"));
        assert!(c.source.contains("test image"));
        assert!(ikconfig_from_vmlinux(&vmlinux[..1000], "none").is_none());
    }
}
