//! Kernel modules for the initramfs, taken from the pin's own verified
//! package.
//!
//! Debian's `.deb`s carry no `modules.dep` (depmod writes it at install
//! time), so dependencies come from each module's own `.modinfo`
//! `depends=`. Up to 6.x the modules sit in the image package; from 7.x in
//! `linux-modules-<release>` (the pin's `modules_package`).
//!
//! Compressed modules are decompressed here unless the package's kernel
//! config proves the kernel undoes that format itself
//! (`CONFIG_MODULE_DECOMPRESS=y` and `CONFIG_MODULE_COMPRESS_<FORMAT>=y`,
//! kernel/module/decompress.c, 5.17+): 5.10 and 6.1 ship plain `.ko` and
//! could not decompress anyway; 6.12 ships `.ko.xz` with its config in the
//! package, so its modules travel compressed; the 7.x module packages carry
//! no config, so theirs are decompressed on the host.
//!
//! Cache layout under the kernel cache root:
//! - `modules/<sha256>`            one shipped module file, content-addressed
//! - `modules/sets/<key>.json`     the resolved set for (package, release,
//!   names): names in dependency order, what each depends on, hashes

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::{FetchOptions, KernelCache};
use crate::error::KernelError;
use crate::extract::{install_verified, sha256_file, walk_deb, InstallError};
use crate::pin::{KernelPin, PackageOf};

/// Bumped when the manifest's meaning changes, so old sets are not reused.
const MANIFEST_FORMAT: u32 = 1;

/// How a module file is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    Xz,
    Zstd,
    Gzip,
}

impl Compression {
    fn from_file_name(name: &str) -> Option<(&str, Option<Compression>)> {
        if let Some(stem) = name.strip_suffix(".ko") {
            return Some((stem, None));
        }
        for (ext, c) in [
            (".ko.xz", Compression::Xz),
            (".ko.zst", Compression::Zstd),
            (".ko.gz", Compression::Gzip),
        ] {
            if let Some(stem) = name.strip_suffix(ext) {
                return Some((stem, Some(c)));
            }
        }
        None
    }

    /// The word the order file uses, also the `CONFIG_MODULE_COMPRESS_*` suffix.
    fn word(self) -> &'static str {
        match self {
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
            Compression::Gzip => "gzip",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Compression::Xz => ".ko.xz",
            Compression::Zstd => ".ko.zst",
            Compression::Gzip => ".ko.gz",
        }
    }
}

/// One module the initramfs carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShippedModule {
    /// Module name as the kernel knows it (`-` folded to `_`).
    pub name: String,
    /// Where it was in the package.
    pub member: String,
    /// Its `.modinfo` `depends=`, in that order.
    pub depends: Vec<String>,
    /// sha256 of the bytes shipped (and the cache file name).
    pub sha256: String,
    pub size: u64,
    /// Shipped compressed: the kernel decompresses it itself.
    pub kernel_decompresses: Option<Compression>,
}

impl ShippedModule {
    /// Its path inside the guest.
    pub fn guest_path(&self) -> String {
        let ext = self
            .kernel_decompresses
            .map_or(".ko", Compression::extension);
        format!("{}/{}{ext}", kloop_protocol::MODULES_DIR, self.name)
    }
}

/// The modules a scenario asked for and everything they need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleSet {
    format: u32,
    /// `uname -r` the modules were built for (checked against `vermagic=`).
    pub release: String,
    /// Dependencies before the modules that need them.
    pub modules: Vec<ShippedModule>,
    /// Asked-for modules the kernel has built in (modules.builtin).
    pub builtin: Vec<String>,
    /// Cache paths of `modules`, same order; filled on load.
    #[serde(skip)]
    paths: Vec<PathBuf>,
}

impl ModuleSet {
    /// Modules the kernel has built in, nothing to ship: the order file
    /// marks each `builtin`, so the agent's `modprobe` says so and moves on.
    pub fn builtin_only(names: Vec<String>) -> ModuleSet {
        ModuleSet {
            format: 1,
            release: String::new(),
            modules: Vec::new(),
            builtin: names,
            paths: Vec::new(),
        }
    }

    /// Modules built with a local kernel (its checks' controls,
    /// [`crate::build::controls`]) shipped as they are, as (name, path),
    /// with `builtin` the asked-for modules the kernel has built in. They
    /// need nothing but the kernel, so none depends on another.
    pub fn local(
        release: &str,
        files: &[(String, PathBuf)],
        builtin: Vec<String>,
    ) -> std::io::Result<ModuleSet> {
        let mut modules = Vec::with_capacity(files.len());
        for (name, path) in files {
            let bytes = std::fs::read(path).map_err(|e| {
                std::io::Error::new(e.kind(), format!("reading module {}: {e}", path.display()))
            })?;
            modules.push(ShippedModule {
                name: canonical(name),
                member: path.display().to_string(),
                depends: Vec::new(),
                sha256: hex::encode(Sha256::digest(&bytes)),
                size: bytes.len() as u64,
                kernel_decompresses: None,
            });
        }
        Ok(ModuleSet {
            format: 1,
            release: release.to_string(),
            modules,
            builtin,
            paths: files.iter().map(|(_, p)| p.clone()).collect(),
        })
    }

    /// The `order` file the guest reads (format in [`kloop_protocol::MODULES_DIR`]).
    pub fn order_file(&self) -> String {
        let mut out = String::new();
        for m in &self.modules {
            let how = m.kernel_decompresses.map_or("plain", Compression::word);
            out += &format!(
                "{}\t{}\t{how}\t{}\n",
                m.name,
                m.guest_path(),
                m.depends.join(",")
            );
        }
        for name in &self.builtin {
            out += &format!("{name}\t-\tbuiltin\t\n");
        }
        out
    }

    /// What the modules add to the guest's initramfs: every module file and
    /// the order file the agent's `modprobe` step reads, as (guest path,
    /// bytes), all under [`kloop_protocol::MODULES_DIR`].
    pub fn initramfs_files(&self) -> std::io::Result<Vec<(String, Vec<u8>)>> {
        let mut files = Vec::with_capacity(self.modules.len() + 1);
        for (m, path) in self.modules.iter().zip(&self.paths) {
            let data = std::fs::read(path).map_err(|e| {
                std::io::Error::new(e.kind(), format!("reading module {}: {e}", path.display()))
            })?;
            files.push((m.guest_path(), data));
        }
        files.push((
            format!("{}/order", kloop_protocol::MODULES_DIR),
            self.order_file().into_bytes(),
        ));
        Ok(files)
    }

    /// Bytes the modules add to the initramfs (files only).
    pub fn shipped_bytes(&self) -> u64 {
        self.modules.iter().map(|m| m.size).sum()
    }
}

/// `foo-bar` and `foo_bar` are the same module to the kernel.
fn canonical(name: &str) -> String {
    name.replace('-', "_")
}

/// The module a package member is, if it is one of `release`'s modules.
fn module_of(path: &Path, release: &str) -> Option<(String, Option<Compression>)> {
    let s = path.to_str()?;
    let rest = s
        .strip_prefix("usr/lib/modules/")
        .or_else(|| s.strip_prefix("lib/modules/"))?;
    let rest = rest.strip_prefix(release)?.strip_prefix('/')?;
    let file = rest.rsplit('/').next()?;
    let (stem, c) = Compression::from_file_name(file)?;
    Some((canonical(stem), c))
}

fn is_release_file(path: &Path, release: &str, file: &str) -> bool {
    let s = path.to_string_lossy();
    [
        format!("lib/modules/{release}/{file}"),
        format!("usr/lib/modules/{release}/{file}"),
    ]
    .iter()
    .any(|p| *p == s)
}

fn is_config(path: &Path, release: &str) -> bool {
    path.to_string_lossy() == format!("boot/config-{release}")
        || is_release_file(path, release, "config")
}

/// Does a kernel built with `config` load modules compressed with `c`?
fn kernel_decompresses(config: &str, c: Compression) -> bool {
    let set = |opt: &str| config.lines().any(|l| l.trim() == format!("{opt}=y"));
    set("CONFIG_MODULE_DECOMPRESS")
        && set(&format!(
            "CONFIG_MODULE_COMPRESS_{}",
            c.word().to_ascii_uppercase()
        ))
}

fn decompress(data: &[u8], c: Compression) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(data.len() * 4);
    match c {
        Compression::Xz => lzma_rs::xz_decompress(&mut &data[..], &mut out)
            .map_err(|e| format!("xz decompression failed: {e}"))?,
        Compression::Zstd => {
            ruzstd::decoding::StreamingDecoder::new(data)
                .map_err(|e| format!("zstd decompression failed: {e}"))?
                .read_to_end(&mut out)
                .map_err(|e| format!("zstd decompression failed: {e}"))?;
        }
        Compression::Gzip => {
            return Err("gzip modules are not supported by this host (no decoder); \
                        no pinned kernel ships them"
                .into())
        }
    }
    Ok(out)
}

/// What `.modinfo` says about a module.
/// Modules whose dependencies lead back to the first, in order.
struct Cycle(Vec<String>);

#[derive(Debug, Default)]
struct ModInfo {
    name: Option<String>,
    depends: Vec<String>,
    vermagic: Option<String>,
}

/// Why a module's `.modinfo` does not read (a `BadModule`'s reason).
#[derive(Debug, thiserror::Error)]
enum ModinfoError {
    #[error("not an ELF object: {0}")]
    NotElf(object::Error),
    #[error("it has no .modinfo section")]
    NoSection,
    #[error("unreadable .modinfo: {0}")]
    Unreadable(object::Error),
}

fn modinfo(elf: &[u8]) -> Result<ModInfo, ModinfoError> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(elf).map_err(ModinfoError::NotElf)?;
    let section = file
        .section_by_name(".modinfo")
        .ok_or(ModinfoError::NoSection)?;
    let data = section.data().map_err(ModinfoError::Unreadable)?;
    let mut info = ModInfo::default();
    for field in data.split(|&b| b == 0) {
        let field = String::from_utf8_lossy(field);
        if let Some(v) = field.strip_prefix("depends=") {
            info.depends = v
                .split(',')
                .filter(|d| !d.is_empty())
                .map(canonical)
                .collect();
        } else if let Some(v) = field.strip_prefix("name=") {
            info.name = Some(canonical(v));
        } else if let Some(v) = field.strip_prefix("vermagic=") {
            info.vermagic = Some(v.to_string());
        }
    }
    Ok(info)
}

/// A module read out of the package, before it is cached.
struct Found {
    member: String,
    compression: Option<Compression>,
    bytes: Vec<u8>,
}

/// A package walk: calls `visit(path, reader, is_regular_file)` for every entry.
type Visitor<'a> = dyn FnMut(&Path, &mut dyn Read, bool) -> Result<(), KernelError> + 'a;

/// What the walks over the package learnt.
#[derive(Default)]
struct Scan {
    /// Every module of the release in the package: name → (member, compression).
    index: BTreeMap<String, (String, Option<Compression>)>,
    builtin: Option<BTreeSet<String>>,
    config: Option<String>,
    found: HashMap<String, Found>,
}

/// The outcome of [`resolve`].
struct Resolved {
    scan: Scan,
    /// `(name, depends)`, dependencies first.
    order: Vec<(String, Vec<String>)>,
    /// Asked-for names the kernel has built in.
    builtin: Vec<String>,
}

/// Reads a found module's `.modinfo`: its dependencies, after checking it
/// is the module it claims to be and was built for `release`.
fn analyse(
    name: &str,
    found: &Found,
    archive: &Path,
    release: &str,
) -> Result<Vec<String>, KernelError> {
    let elf = match found.compression {
        None => std::borrow::Cow::Borrowed(&found.bytes[..]),
        Some(c) => std::borrow::Cow::Owned(
            decompress(&found.bytes, c)
                .map_err(|reason| bad_module(name, found, archive, reason))?,
        ),
    };
    let ModInfo {
        name: own_name,
        depends,
        vermagic,
    } = modinfo(&elf).map_err(|e| bad_module(name, found, archive, e.to_string()))?;
    if let Some(own) = own_name.filter(|own| own != name) {
        return Err(bad_module(
            name,
            found,
            archive,
            format!(".modinfo names it `{own}`"),
        ));
    }
    let magic_release = vermagic
        .as_deref()
        .and_then(|v| v.split_whitespace().next());
    if magic_release != Some(release) {
        return Err(bad_module(
            name,
            found,
            archive,
            format!(
                "built for {:?} (vermagic), not for release {release}",
                vermagic.unwrap_or_default()
            ),
        ));
    }
    Ok(depends)
}

/// Resolves `names` and their dependencies in the package `walk` reads.
/// A module's dependencies are wanted as soon as it is read, so those later
/// in the archive come in the same walk; another walk runs only for
/// dependencies that sat earlier (usually none: one walk in all).
/// Returns the modules in dependency order (as read, not yet decompressed)
/// and the asked-for names the kernel has built in.
fn resolve(
    mut walk: impl FnMut(&mut Visitor<'_>) -> Result<(), KernelError>,
    pin: &KernelPin,
    archive: &Path,
    names: &[String],
    builtin_elsewhere: Option<BTreeSet<String>>,
) -> Result<Resolved, KernelError> {
    let release = pin.release.as_str();
    let mut scan = Scan::default();
    let mut wanted: BTreeSet<String> = names.iter().map(|n| canonical(n)).collect();
    let mut first = true;
    let mut depends: HashMap<String, Vec<String>> = HashMap::new();
    loop {
        walk(&mut |path, reader, regular| {
            if !regular {
                return Ok(());
            }
            if first && is_release_file(path, release, "modules.builtin") {
                let mut text = String::new();
                reader
                    .read_to_string(&mut text)
                    .map_err(|e| bad_read(archive, path, e))?;
                scan.builtin = Some(parse_builtin(&text));
                return Ok(());
            }
            if first && is_config(path, release) {
                let mut text = String::new();
                reader
                    .read_to_string(&mut text)
                    .map_err(|e| bad_read(archive, path, e))?;
                scan.config = Some(text);
                return Ok(());
            }
            let Some((name, compression)) = module_of(path, release) else {
                return Ok(());
            };
            let member = path.display().to_string();
            if first {
                scan.index
                    .entry(name.clone())
                    .or_insert((member.clone(), compression));
            }
            if wanted.contains(&name) && !scan.found.contains_key(&name) {
                let mut bytes = Vec::new();
                reader
                    .read_to_end(&mut bytes)
                    .map_err(|e| bad_read(archive, path, e))?;
                let found = Found {
                    member,
                    compression,
                    bytes,
                };
                let deps = analyse(&name, &found, archive, release)?;
                wanted.extend(deps.iter().cloned());
                depends.insert(name.clone(), deps);
                scan.found.insert(name, found);
            }
            Ok(())
        })?;
        first = false;
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|n| !scan.found.contains_key(*n))
            .collect();
        // Done, or nothing a further walk could find (reported below).
        if missing.iter().all(|n| !scan.index.contains_key(*n)) {
            break;
        }
    }

    if scan.builtin.is_none() {
        scan.builtin = builtin_elsewhere;
    }
    let builtin = builtin_or_missing(&scan, pin, archive, names)?;
    check_dependencies(&scan, &depends, pin, archive)?;
    let order = dependency_order(&scan, archive, names, &builtin, &depends)?;
    Ok(Resolved {
        scan,
        order,
        builtin,
    })
}

/// The module names a `modules.builtin` lists.
fn parse_builtin(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.rsplit('/').next())
        .filter_map(|f| Compression::from_file_name(f).map(|(s, _)| canonical(s)))
        .collect()
}

/// `modules.builtin` of `release` in `deb`, if it has one: from 7.x Debian
/// ships it in `linux-base-<release>` beside the `.config`, not with the
/// modules.
fn builtin_in(deb: &Path, release: &str) -> Result<Option<BTreeSet<String>>, KernelError> {
    let mut found = None;
    walk_deb(deb, |path, entry| {
        if found.is_none()
            && entry.header().entry_type() == tar::EntryType::Regular
            && is_release_file(path, release, "modules.builtin")
        {
            let mut text = String::new();
            entry
                .read_to_string(&mut text)
                .map_err(|e| bad_read(deb, path, e))?;
            found = Some(parse_builtin(&text));
        }
        Ok(())
    })?;
    Ok(found)
}

/// The asked-for `names` the kernel has built in; an error for the first
/// that is neither in the package nor built in.
fn builtin_or_missing(
    scan: &Scan,
    pin: &KernelPin,
    archive: &Path,
    names: &[String],
) -> Result<Vec<String>, KernelError> {
    let mut builtin = Vec::new();
    for asked in names.iter().map(|n| canonical(n)) {
        if scan.found.contains_key(&asked) || builtin.contains(&asked) {
            continue;
        }
        match &scan.builtin {
            Some(b) if b.contains(&asked) => builtin.push(asked),
            other => {
                let builtin_note = match other {
                    Some(_) => "modules.builtin does not list it either".to_string(),
                    None => "the package has no modules.builtin to say whether it is built in"
                        .to_string(),
                };
                let stem: String = asked.chars().take(3).collect();
                let similar: Vec<&str> = scan
                    .index
                    .keys()
                    .filter(|k| k.contains(&stem))
                    .take(8)
                    .map(String::as_str)
                    .collect();
                return Err(KernelError::ModuleMissing {
                    id: pin.id.clone(),
                    module: asked,
                    archive: archive.to_path_buf(),
                    detail: if similar.is_empty() {
                        builtin_note
                    } else {
                        format!("{builtin_note} (similar names: {})", similar.join(", "))
                    },
                });
            }
        }
    }
    Ok(builtin)
}

/// Refuses a found module whose dependency was not found.
fn check_dependencies(
    scan: &Scan,
    depends: &HashMap<String, Vec<String>>,
    pin: &KernelPin,
    archive: &Path,
) -> Result<(), KernelError> {
    // Dependencies must all be there (a dependency is never built in:
    // modpost only records modules that export what is used).
    for (module, deps) in depends {
        for dep in deps {
            if !scan.found.contains_key(dep) {
                return Err(KernelError::ModuleDependencyMissing {
                    id: pin.id.clone(),
                    module: module.clone(),
                    dependency: dep.clone(),
                    archive: archive.to_path_buf(),
                });
            }
        }
    }

    Ok(())
}

/// The asked-for modules and their dependencies, dependencies first: a
/// depth-first post-order from the asked-for names; a cycle is refused.
fn dependency_order(
    scan: &Scan,
    archive: &Path,
    names: &[String],
    builtin: &[String],
    depends: &HashMap<String, Vec<String>>,
) -> Result<Vec<(String, Vec<String>)>, KernelError> {
    let mut order = Vec::new();
    let mut state: HashMap<String, bool> = HashMap::new(); // false: on the path, true: done
    fn visit(
        name: &str,
        depends: &HashMap<String, Vec<String>>,
        state: &mut HashMap<String, bool>,
        order: &mut Vec<(String, Vec<String>)>,
        path: &mut Vec<String>,
    ) -> Result<(), Cycle> {
        match state.get(name) {
            Some(true) => return Ok(()),
            Some(false) => {
                path.push(name.to_string());
                return Err(Cycle(std::mem::take(path)));
            }
            None => {}
        }
        state.insert(name.to_string(), false);
        path.push(name.to_string());
        let deps = depends.get(name).cloned().unwrap_or_default();
        for d in &deps {
            visit(d, depends, state, order, path)?;
        }
        path.pop();
        state.insert(name.to_string(), true);
        order.push((name.to_string(), deps));
        Ok(())
    }
    for asked in names.iter().map(|n| canonical(n)) {
        if builtin.contains(&asked) {
            continue;
        }
        visit(&asked, depends, &mut state, &mut order, &mut Vec::new()).map_err(|cycle| {
            let found = &scan.found[&asked];
            bad_module(
                &asked,
                found,
                archive,
                format!("its dependencies form a cycle: {}", cycle.0.join(" → ")),
            )
        })?;
    }
    Ok(order)
}

fn bad_read(archive: &Path, member: &Path, e: std::io::Error) -> KernelError {
    KernelError::BadImage {
        path: archive.to_path_buf(),
        reason: format!("reading {} failed: {e}", member.display()),
    }
}

fn bad_module(name: &str, found: &Found, archive: &Path, reason: String) -> KernelError {
    KernelError::BadModule {
        module: name.to_string(),
        member: found.member.clone(),
        archive: archive.to_path_buf(),
        reason,
    }
}

/// The cache key of a module set: the manifest format, the package, the
/// release and the requested names as the kernel spells them, sorted and
/// deduplicated so that the same set asked in another order is one entry.
fn set_key(package_sha: &str, release: &str, names: &[String]) -> String {
    let mut sorted: Vec<String> = names.iter().map(|n| canonical(n)).collect();
    sorted.sort();
    sorted.dedup();
    hex::encode(Sha256::digest(
        format!(
            "kloop modules v{MANIFEST_FORMAT}\n{package_sha}\n{release}\n{}",
            sorted.join("\n")
        )
        .as_bytes(),
    ))
}

impl KernelCache {
    /// The modules `names` of `pin` and their dependencies, ready for the
    /// initramfs. A hit reads the cached set and re-hashes every file; a
    /// miss reads the pin's verified module package.
    pub fn ensure_modules(
        &self,
        pin: &KernelPin,
        names: &[String],
        opts: &FetchOptions,
    ) -> Result<ModuleSet, KernelError> {
        let package_sha = match pin.modules_of() {
            PackageOf::Companion { sha256, .. } => sha256,
            PackageOf::Unserved { package } => return Err(pin.unserved_error(package, "modules")),
            PackageOf::Image => pin.deb_sha256.as_str(),
        };
        let key = set_key(package_sha, &pin.release, names);
        let dir = self.root().join("modules");
        let manifest = dir.join("sets").join(format!("{key}.json"));
        if let Some(set) = self.cached_set(&manifest, &dir) {
            return Ok(set);
        }

        let deb = self.ensure_modules_deb(pin, opts)?;
        let mut walker = |visit: &mut Visitor<'_>| {
            walk_deb(&deb, |path, entry| {
                let regular = entry.header().entry_type() == tar::EntryType::Regular;
                visit(path, entry, regular)
            })
        };
        // A module the package lacks may be built in, which from 7.x only
        // the companion `linux-base` package's modules.builtin says: read it
        // then, not before (a set the package holds needs no other package).
        let resolved = match (
            resolve(&mut walker, pin, &deb, names, None),
            pin.config_of(),
        ) {
            (Err(KernelError::ModuleMissing { .. }), PackageOf::Companion { package, sha256 }) => {
                let elsewhere = builtin_in(
                    &self.ensure_package(pin, package, sha256, opts)?,
                    &pin.release,
                )?;
                resolve(&mut walker, pin, &deb, names, elsewhere)
            }
            (other, _) => other,
        };
        let Resolved {
            mut scan,
            order,
            builtin,
        } = resolved?;
        mkdir(&dir.join("sets"))?;
        let mut set = ModuleSet {
            format: MANIFEST_FORMAT,
            release: pin.release.clone(),
            modules: Vec::new(),
            builtin,
            paths: Vec::new(),
        };
        for (name, depends) in order {
            let found = scan
                .found
                .remove(&name)
                .expect("ordered modules were found");
            let keep = found.compression.filter(|&c| {
                scan.config
                    .as_deref()
                    .is_some_and(|cfg| kernel_decompresses(cfg, c))
            });
            let bytes = match (found.compression, keep) {
                (Some(c), None) => decompress(&found.bytes, c)
                    .map_err(|reason| bad_module(&name, &found, &deb, reason))?,
                _ => found.bytes,
            };
            let (path, sha256) = install_verified(&bytes[..], &dir, None, None)
                .map_err(|e| install_error(e, &dir))?;
            set.modules.push(ShippedModule {
                name,
                member: found.member,
                depends,
                sha256,
                size: bytes.len() as u64,
                kernel_decompresses: keep,
            });
            set.paths.push(path);
        }
        let json = serde_json::to_vec_pretty(&set).expect("a module set serialises");
        install_verified(
            &json[..],
            &dir.join("sets"),
            Some(&format!("{key}.json")),
            None,
        )
        .map_err(|e| install_error(e, &manifest))?;
        Ok(set)
    }

    /// A cached set whose every file still has its hash, else `None`
    /// (the caller rebuilds it from the package).
    fn cached_set(&self, manifest: &Path, dir: &Path) -> Option<ModuleSet> {
        let text = std::fs::read(manifest).ok()?;
        let mut set: ModuleSet = serde_json::from_slice(&text).ok()?;
        if set.format != MANIFEST_FORMAT {
            return None;
        }
        for m in &set.modules {
            let path = dir.join(&m.sha256);
            if sha256_file(&path).ok()? != m.sha256 {
                tracing::warn!(
                    "kloop: cached module {} was corrupt; extracting it again",
                    path.display()
                );
                return None;
            }
            set.paths.push(path);
        }
        Some(set)
    }
}

/// Installing bytes already in memory can only fail to write.
fn install_error(e: InstallError, path: &Path) -> KernelError {
    match e {
        InstallError::Write(e) => KernelError::CacheWrite(e),
        InstallError::Read(source) => KernelError::CacheWrite(PathIo::at("writing", path, source)),
        InstallError::Mismatch { .. } => unreachable!("no hash expected"),
    }
}

fn mkdir(dir: &Path) -> Result<(), KernelError> {
    std::fs::create_dir_all(dir)
        .at("creating", dir)
        .map_err(KernelError::CacheWrite)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::walk_tar;

    /// A minimal ELF64 relocatable object whose only named section is
    /// `.modinfo` with `fields`, laid out as the kernel's modpost writes it.
    fn fake_module(fields: &[&str]) -> Vec<u8> {
        let mut modinfo = Vec::new();
        for f in fields {
            modinfo.extend_from_slice(f.as_bytes());
            modinfo.push(0);
        }
        let shstrtab = b"\0.modinfo\0.shstrtab\0";
        let modinfo_off = 64u64;
        let shstr_off = modinfo_off + modinfo.len() as u64;
        let sh_off = (shstr_off + shstrtab.len() as u64).next_multiple_of(8);
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2; // 64-bit
        out[5] = 1; // little endian
        out[6] = 1; // version
        out[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
        out[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
        out[20..24].copy_from_slice(&1u32.to_le_bytes());
        out[40..48].copy_from_slice(&sh_off.to_le_bytes());
        out[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
        out[58..60].copy_from_slice(&64u16.to_le_bytes()); // shentsize
        out[60..62].copy_from_slice(&3u16.to_le_bytes()); // shnum
        out[62..64].copy_from_slice(&2u16.to_le_bytes()); // shstrndx
        out.extend_from_slice(&modinfo);
        out.extend_from_slice(shstrtab);
        out.resize(sh_off as usize, 0);
        let section = |name: u32, kind: u32, off: u64, size: u64| {
            let mut s = vec![0u8; 64];
            s[..4].copy_from_slice(&name.to_le_bytes());
            s[4..8].copy_from_slice(&kind.to_le_bytes());
            s[24..32].copy_from_slice(&off.to_le_bytes());
            s[32..40].copy_from_slice(&size.to_le_bytes());
            s[48..56].copy_from_slice(&1u64.to_le_bytes());
            s
        };
        out.extend(vec![0u8; 64]);
        out.extend(section(1, 1, modinfo_off, modinfo.len() as u64));
        out.extend(section(10, 3, shstr_off, shstrtab.len() as u64));
        out
    }

    const REL: &str = "6.1.0-50-cloud-amd64";

    fn module(name: &str, depends: &str) -> Vec<u8> {
        fake_module(&[
            "license=GPL",
            &format!("depends={depends}"),
            &format!("name={name}"),
            &format!("vermagic={REL} SMP preempt mod_unload modversions "),
        ])
    }

    fn tar_of(files: &[(String, Vec<u8>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            b.append_data(&mut h, path, &data[..]).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn pin() -> KernelPin {
        KernelPin {
            id: "6.1".into(),
            series: "6.1".into(),
            suite: "bookworm".into(),
            package: format!("linux-image-{REL}"),
            version: "1".into(),
            deb_sha256: "0".repeat(64),
            image_path: format!("boot/vmlinuz-{REL}"),
            image_sha256: "0".repeat(64),
            release: REL.into(),
            config: None,
            modules_package: None,
            modules_deb_sha256: None,
            config_package: None,
            config_deb_sha256: None,
            unserved: Vec::new(),
        }
    }

    fn run(files: &[(String, Vec<u8>)], names: &[&str]) -> Result<Resolved, KernelError> {
        let tar = tar_of(files);
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut walks = 0;
        let r = resolve(
            |visit| {
                walks += 1;
                walk_tar(&tar[..], Path::new("x.deb"), |p, e| {
                    let regular = e.header().entry_type() == tar::EntryType::Regular;
                    visit(p, e, regular)
                })
            },
            &pin(),
            Path::new("x.deb"),
            &names,
            None,
        );
        assert!(walks <= 2, "{walks} walks");
        r
    }

    fn m(path: &str, data: Vec<u8>) -> (String, Vec<u8>) {
        (format!("./lib/modules/{REL}/kernel/{path}"), data)
    }

    #[test]
    fn dependencies_come_first_and_dashes_fold() {
        let files = [
            m("net/vxlan.ko", module("vxlan", "udp_tunnel,ip6_udp_tunnel")),
            m("net/udp_tunnel.ko", module("udp_tunnel", "")),
            m(
                "net/ip6_udp_tunnel.ko",
                module("ip6_udp_tunnel", "udp_tunnel"),
            ),
            m("drivers/net/veth.ko", module("veth", "")),
            m("other/unused.ko", module("unused", "")),
        ];
        let Resolved { order, builtin, .. } = run(&files, &["vxlan", "veth"]).unwrap();
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["udp_tunnel", "ip6_udp_tunnel", "vxlan", "veth"]);
        assert!(builtin.is_empty());
        // `-` and `_` are one name.
        let order = run(&files, &["ip6-udp-tunnel"]).unwrap().order;
        assert_eq!(order[0].0, "udp_tunnel");
        assert_eq!(
            order[1],
            ("ip6_udp_tunnel".into(), vec!["udp_tunnel".into()])
        );
    }

    #[test]
    fn missing_module_and_missing_dependency_are_named() {
        let files = [
            m("net/vxlan.ko", module("vxlan", "udp_tunnel")),
            m("drivers/net/veth.ko", module("veth", "")),
            (
                format!("./lib/modules/{REL}/modules.builtin"),
                b"kernel/net/ipv4/tcp_cubic.ko\n".to_vec(),
            ),
        ];
        let err = run(&files, &["vet"]).err().unwrap();
        let msg = err.to_string();
        assert!(matches!(err, KernelError::ModuleMissing { .. }), "{msg}");
        assert!(
            msg.contains("`vet`") && msg.contains("similar names: veth)"),
            "{msg}"
        );
        assert!(msg.contains("modules.builtin does not list it"), "{msg}");

        let err = run(&files, &["vxlan"]).err().unwrap();
        let KernelError::ModuleDependencyMissing {
            module, dependency, ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(
            (module.as_str(), dependency.as_str()),
            ("vxlan", "udp_tunnel")
        );

        // Built in: not an error, shipped as such.
        let Resolved { order, builtin, .. } = run(&files, &["tcp_cubic", "veth"]).unwrap();
        assert_eq!(builtin, ["tcp_cubic"]);
        assert_eq!(order.len(), 1);
    }

    #[test]
    fn foreign_or_broken_modules_are_refused() {
        let other = fake_module(&[
            "depends=",
            "name=veth",
            "vermagic=5.10.0-32-cloud-amd64 SMP",
        ]);
        let err = run(&[m("drivers/net/veth.ko", other)], &["veth"])
            .err()
            .unwrap();
        assert!(err.to_string().contains("not for release"), "{err}");
        let err = run(&[m("drivers/net/veth.ko", b"junk".to_vec())], &["veth"])
            .err()
            .unwrap();
        assert!(err.to_string().contains("not an ELF object"), "{err}");
        let cycle = [m("a.ko", module("a", "b")), m("b.ko", module("b", "a"))];
        let err = run(&cycle, &["a"]).err().unwrap();
        assert!(err.to_string().contains("cycle: a → b → a"), "{err}");
    }

    #[test]
    fn modules_of_another_release_are_ignored() {
        let files = [(
            "./lib/modules/5.10.0-32-cloud-amd64/kernel/drivers/net/veth.ko".to_string(),
            module("veth", ""),
        )];
        assert!(matches!(
            run(&files, &["veth"]),
            Err(KernelError::ModuleMissing { .. })
        ));
    }

    #[test]
    fn config_decides_who_decompresses() {
        let cfg = "CONFIG_MODULE_COMPRESS_XZ=y\nCONFIG_MODULE_DECOMPRESS=y\n";
        assert!(kernel_decompresses(cfg, Compression::Xz));
        assert!(!kernel_decompresses(cfg, Compression::Zstd));
        assert!(!kernel_decompresses(
            "CONFIG_MODULE_COMPRESS_XZ=y\n# CONFIG_MODULE_DECOMPRESS is not set\n",
            Compression::Xz
        ));
    }

    #[test]
    fn cached_set_is_used_only_while_every_file_hashes_right() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path());
        let mods = dir.path().join("modules");
        std::fs::create_dir_all(mods.join("sets")).unwrap();
        let data = module("veth", "");
        let (path, sha256) = install_verified(&data[..], &mods, None, None).unwrap();
        let set = ModuleSet {
            format: MANIFEST_FORMAT,
            release: REL.into(),
            modules: vec![ShippedModule {
                name: "veth".into(),
                member: "lib/modules/x/veth.ko".into(),
                depends: vec![],
                sha256,
                size: data.len() as u64,
                kernel_decompresses: None,
            }],
            builtin: vec![],
            paths: vec![],
        };
        let manifest = mods.join("sets/k.json");
        std::fs::write(&manifest, serde_json::to_vec(&set).unwrap()).unwrap();
        let got = cache.cached_set(&manifest, &mods).unwrap();
        assert_eq!(got.paths, std::slice::from_ref(&path));
        let files = got.initramfs_files().unwrap();
        assert_eq!(files.len(), 2, "module, order file");
        assert_eq!(files[0].1, data);

        std::fs::write(&path, b"truncated").unwrap();
        assert!(cache.cached_set(&manifest, &mods).is_none());
    }

    #[test]
    fn order_file_lists_dependencies_first() {
        let set = ModuleSet {
            format: MANIFEST_FORMAT,
            release: REL.into(),
            modules: vec![
                ShippedModule {
                    name: "udp_tunnel".into(),
                    member: "x".into(),
                    depends: vec![],
                    sha256: "a".into(),
                    size: 1,
                    kernel_decompresses: Some(Compression::Xz),
                },
                ShippedModule {
                    name: "vxlan".into(),
                    member: "y".into(),
                    depends: vec!["udp_tunnel".into(), "ip6_udp_tunnel".into()],
                    sha256: "b".into(),
                    size: 2,
                    kernel_decompresses: None,
                },
            ],
            builtin: vec!["tcp_cubic".into()],
            paths: vec![],
        };
        assert_eq!(
            set.order_file(),
            "udp_tunnel\t/kloop/modules/udp_tunnel.ko.xz\txz\t\n\
             vxlan\t/kloop/modules/vxlan.ko\tplain\tudp_tunnel,ip6_udp_tunnel\n\
             tcp_cubic\t-\tbuiltin\t\n"
        );
    }
}
