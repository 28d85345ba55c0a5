//! Source builds: a bootable kernel from a Debian `linux-source-X.Y`
//! package or a local tree, with patches and config fragments, cached.
//!
//! Cache layout under `<cache>/build/`:
//! - `src/<deb sha256>/<package>/`  pristine trees unpacked from packages
//! - `trees/<slot>/tree/`           patched copies (one per source)
//! - `out/<slot>/`                  kbuild output directories (`O=`), one
//!   per source × {pristine, patched}, reused: an incremental rebuild only
//!   recompiles what changed
//! - `kernels/<id>/`                finished kernels: `bzImage`, `config`,
//!   `build.log`, `kernel.toml`
//!
//! A kernel's id is a hash of everything that decides its bytes: the
//! source's identity (the package's sha256, or the tree's content stamp),
//! each patch's sha256, the config base and every fragment's sha256, and
//! the compiler's and pahole's versions. The same request again finds
//! `kernels/<id>/` and costs nothing; `kernel.toml` also records the
//! resolved `.config`'s hash.

pub mod controls;
pub mod git;
mod kconfig;
mod make;
pub mod objects;
mod source;

pub use kconfig::{read_fragments, Dropped, Requested};
pub use source::{check_applies, check_patch, patch_files, pin_source, SourcePin, SourceSpec};

use std::path::{Path, PathBuf};
use std::time::Instant;

use kloop_path_io::{PathIo, PathIoExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::{FetchOptions, KernelCache};
use crate::config::KernelConfig;
use crate::error::KernelError;

/// Why a build did not produce a kernel.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Fetch(#[from] KernelError),
    #[error("unknown kernel source `{name}` ({detail}); pinned source packages: {known}; or give the path of a kernel tree")]
    UnknownSource {
        name: String,
        detail: String,
        known: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("`{tool}` is not installed; install the Debian package `{package}` (apt-get install {package})")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },
    #[error("patch {patch} does not apply:\n{output}")]
    PatchFailed { patch: PathBuf, output: String },
    #[error("{patch} is not a patch: {why}")]
    NotAPatch { patch: PathBuf, why: String },
    #[error("the resolved config ({config}) lost {} option(s) the fragments asked for:\n  {}\nenable what they depend on in a fragment (--config FILE), or drop them", dropped.len(), dropped.join("\n  "))]
    ConfigDropped {
        dropped: Vec<String>,
        config: PathBuf,
    },
    #[error("`make {target}` failed ({status}); the compiler said:\n  {}\nfull log: {log}", if errors.is_empty() { "(no error lines found; see the log)".to_string() } else { errors.join("\n  ") })]
    Compile {
        target: String,
        status: String,
        errors: Vec<String>,
        log: PathBuf,
    },
    #[error("no built kernel `{id}` in {dir}; built kernels: {known}; build one with `cargo xtask kernels build`")]
    NotBuilt {
        id: String,
        dir: PathBuf,
        known: String,
    },
}

impl BuildError {
    /// The inputs do not build (a patch, the config, the compiler): a
    /// `BUILD` failure, not kloop's environment.
    pub fn is_build_failure(&self) -> bool {
        matches!(
            self,
            BuildError::PatchFailed { .. }
                | BuildError::ConfigDropped { .. }
                | BuildError::Compile { .. }
        )
    }
}

/// What happens during a build, for progress.
#[derive(Debug, Clone)]
pub enum BuildEvent {
    /// A step starts (fetching, unpacking, configuring, compiling).
    Phase(String),
    /// One line of kbuild's output.
    Line(String),
}

/// The base config the fragments are merged onto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigBase {
    /// `make tinyconfig`: the smallest kernel, built in minutes.
    #[default]
    Tinyconfig,
    /// `make defconfig`.
    Defconfig,
}

impl ConfigBase {
    fn target(self) -> &'static str {
        match self {
            ConfigBase::Tinyconfig => "tinyconfig",
            ConfigBase::Defconfig => "defconfig",
        }
    }
}

/// `--base`'s value names no config base.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown config base `{0}`: use tinyconfig or defconfig")]
pub struct UnknownConfigBase(pub String);

impl std::str::FromStr for ConfigBase {
    type Err = UnknownConfigBase;
    fn from_str(s: &str) -> Result<Self, UnknownConfigBase> {
        match s {
            "tinyconfig" => Ok(ConfigBase::Tinyconfig),
            "defconfig" => Ok(ConfigBase::Defconfig),
            o => Err(UnknownConfigBase(o.to_string())),
        }
    }
}

/// A kernel's own runtime checks, built in with a config fragment of
/// `kernels/configs/checks/` (`--checks memory,locking,ub`): their reports
/// are read by the agent and judged by `kloop_judge::kernel_log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Check {
    /// KASAN (generic, with vmalloc shadow) and kmemleak.
    Memory,
    /// lockdep (PROVE_LOCKING) and DEBUG_ATOMIC_SLEEP.
    Locking,
    /// UBSAN's bounds checks.
    Ub,
}

impl Check {
    /// Every check, in the order `--checks` lists them.
    pub const ALL: [Check; 3] = [Check::Memory, Check::Locking, Check::Ub];

    /// The name `--checks` takes.
    pub fn name(self) -> &'static str {
        match self {
            Check::Memory => "memory",
            Check::Locking => "locking",
            Check::Ub => "ub",
        }
    }

    /// Its fragment under the workspace's `kernels/` directory.
    pub fn fragment(self, kernels_dir: &std::path::Path) -> PathBuf {
        kernels_dir
            .join("configs")
            .join("checks")
            .join(format!("{}.config", self.name()))
    }
}

/// `--checks` names no check; `known` lists them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown check `{name}`: use {known}")]
pub struct UnknownCheck {
    pub name: String,
    pub known: String,
}

impl std::str::FromStr for Check {
    type Err = UnknownCheck;
    fn from_str(s: &str) -> Result<Self, UnknownCheck> {
        Check::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| UnknownCheck {
                name: s.to_string(),
                known: Check::ALL.map(Check::name).join(", "),
            })
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub source: SourceSpec,
    /// Applied in order with `patch -p1`.
    pub patches: Vec<PathBuf>,
    /// kloop's own fragment (`kernels/configs/kloop.config`), merged first.
    pub kloop_fragment: PathBuf,
    /// The user's fragments, merged after it (a later one wins).
    pub fragments: Vec<PathBuf>,
    pub base: ConfigBase,
    pub jobs: usize,
    pub fetch: FetchOptions,
    /// The checks' positive controls (`kernels/controls/`), built against
    /// the kernel and kept beside it ([`controls`]); `--checks` asks for
    /// them. Part of the id: changed controls are another kernel directory.
    pub controls: Option<PathBuf>,
    /// The architecture to build for: x86-64 natively, arm64 with Debian's
    /// cross compiler and kloop's arm64 fragment ([`BuildRequest::for_arch`]).
    pub arch: kloop_protocol::Arch,
}

impl BuildRequest {
    /// The same request built for `arch`: kloop's fragment becomes that
    /// architecture's (`kloop-arm64.config` beside `kloop.config`, whose
    /// x86 boot options arm64 has not).
    pub fn for_arch(mut self, arch: kloop_protocol::Arch) -> BuildRequest {
        if arch != kloop_protocol::Arch::X86_64 {
            self.kloop_fragment = self
                .kloop_fragment
                .with_file_name(format!("kloop-{arch}.config"));
        }
        self.arch = arch;
        self
    }

    /// The image `make` leaves in the output directory, and its target.
    pub fn image_target(&self) -> (&'static str, &'static str) {
        match self.arch {
            kloop_protocol::Arch::X86_64 => ("arch/x86/boot/bzImage", "bzImage"),
            kloop_protocol::Arch::Arm64 => ("arch/arm64/boot/Image", "Image"),
        }
    }

    /// `source` with kloop's fragment (`kernels/configs/kloop.config` under
    /// `kernels`) on tinyconfig, no patches nor other fragments, a job per
    /// core, the default fetch: the one place a request starts from.
    pub fn new(source: SourceSpec, kernels: &std::path::Path) -> BuildRequest {
        BuildRequest {
            source,
            patches: Vec::new(),
            kloop_fragment: kernels.join("configs/kloop.config"),
            fragments: Vec::new(),
            base: ConfigBase::default(),
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            fetch: FetchOptions::default(),
            controls: None,
            arch: kloop_protocol::Arch::X86_64,
        }
    }

    /// Every fragment merged, in order: kloop's, the source package's own
    /// (`configs/<package>.config` beside kloop's, when there is one:
    /// what an older series needs for kloop's options to survive, such as
    /// 6.1's BPF_JIT depending on MODULES), then the user's.
    pub fn fragment_paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.kloop_fragment.clone()];
        if let SourceSpec::Package(pin) = &self.source {
            let own = self
                .kloop_fragment
                .with_file_name(format!("{}.config", pin.package));
            if own.is_file() {
                paths.push(own);
            }
        }
        paths.extend(self.fragments.iter().cloned());
        paths
    }

    /// The same build with `patches` applied (a candidate, a mutant, a
    /// schema kernel).
    pub fn with_patches(&self, patches: Vec<PathBuf>) -> BuildRequest {
        BuildRequest {
            patches,
            ..self.clone()
        }
    }
}

/// A file and its sha256, as recorded in `kernel.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashedFile {
    pub path: PathBuf,
    pub sha256: String,
}

/// `kernels/<id>/kernel.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildRecord {
    pub id: String,
    /// `linux-source-6.12 6.12.117-1~deb12u1`, or the tree's path.
    pub source: String,
    pub source_identity: String,
    pub patches: Vec<HashedFile>,
    pub base: ConfigBase,
    pub fragments: Vec<HashedFile>,
    /// sha256 of the resolved `.config`'s options ([`KernelConfig::content_hash`]).
    pub config_sha256: String,
    pub compiler: String,
    pub pahole: String,
    /// `uname -r` of the built kernel.
    pub release: String,
    pub image_sha256: String,
    /// Wall seconds of the compile (`make bzImage`), and whether its
    /// output directory already held a build (incremental).
    pub build_secs: f64,
    pub incremental: bool,
    /// Options kloop's fragment asked for that this tree does not know.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// A finished kernel in the cache.
#[derive(Debug, Clone)]
pub struct BuiltKernel {
    pub dir: PathBuf,
    pub record: BuildRecord,
    /// Served from the cache without building.
    pub cached: bool,
}

impl BuiltKernel {
    pub fn image(&self) -> PathBuf {
        self.dir.join("bzImage")
    }
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("build.log")
    }
    /// Its checks' control modules, as (module name, path); empty when it
    /// was built without `--checks`.
    pub fn controls(&self) -> Vec<(String, PathBuf)> {
        controls::modules_in(&self.dir)
    }
    pub fn config(&self) -> Result<KernelConfig, KernelError> {
        let mut c = KernelConfig::from_file(&self.config_path())?;
        c.source = format!("the .config of built kernel {}", self.record.id);
        Ok(c)
    }
}

fn kernels_dir(cache: &KernelCache) -> PathBuf {
    cache.root().join("build/kernels")
}

/// The built kernel `id` (a unique prefix of it will do).
pub fn lookup(cache: &KernelCache, id: &str) -> Result<BuiltKernel, BuildError> {
    let all = list(cache);
    let matches: Vec<&BuiltKernel> = all.iter().filter(|k| k.record.id.starts_with(id)).collect();
    match matches.as_slice() {
        [one] if !id.is_empty() => Ok((*one).clone()),
        _ => Err(BuildError::NotBuilt {
            id: id.to_string(),
            dir: kernels_dir(cache),
            known: if all.is_empty() {
                "none".into()
            } else {
                all.iter()
                    .map(|k| k.record.id.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        }),
    }
}

/// Every finished kernel in the cache, oldest first.
pub fn list(cache: &KernelCache) -> Vec<BuiltKernel> {
    let mut out: Vec<(std::time::SystemTime, BuiltKernel)> = Vec::new();
    for e in std::fs::read_dir(kernels_dir(cache))
        .into_iter()
        .flatten()
        .flatten()
    {
        let dir = e.path();
        let toml_path = dir.join("kernel.toml");
        let Ok(text) = std::fs::read_to_string(&toml_path) else {
            continue;
        };
        let Ok(record) = toml::from_str::<BuildRecord>(&text) else {
            continue;
        };
        if !dir.join("bzImage").is_file() {
            continue;
        }
        let when = std::fs::metadata(&toml_path)
            .and_then(|m| m.modified())
            .unwrap_or(std::time::UNIX_EPOCH);
        out.push((
            when,
            BuiltKernel {
                dir,
                record,
                cached: true,
            },
        ));
    }
    out.sort_by_key(|(t, _)| *t);
    out.into_iter().map(|(_, k)| k).collect()
}

fn tool_version(tool: &str, arg: &str) -> String {
    std::process::Command::new(tool)
        .arg(arg)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "none".into())
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())[..16].to_string()
}

/// The unpatched tree of `spec`: the package unpacked once into the cache,
/// or the user's tree itself. Read it, never write it.
pub fn source_tree(
    cache: &KernelCache,
    spec: &SourceSpec,
    fetch: &FetchOptions,
) -> Result<PathBuf, BuildError> {
    source::pristine_tree(cache, spec, fetch, &mut |_| {}).map(|(tree, _)| tree)
}

// Slots are keyed by where the source is (not by its content) and by the
// config inputs, so an edited tree or a new patch set reuses the previous
// build's output directory, and each config keeps its own.
fn slot_of(req: &BuildRequest, fragments: &[HashedFile]) -> String {
    let location = match &req.source {
        SourceSpec::Package(p) => format!("deb:{}", p.deb_sha256),
        SourceSpec::Tree(t) => format!("tree:{}", t.display()),
    };
    let patched = !req.patches.is_empty();
    let mut slot_parts = vec![
        location,
        if patched { "patched" } else { "pristine" }.to_string(),
        req.base.target().to_string(),
    ];
    slot_parts.extend(fragments.iter().map(|f| f.sha256.clone()));
    short_hash(&slot_parts.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The output directory (objects, `vmlinux`) where `req`'s kernel is built,
/// when it still holds that kernel: the slot is shared by every request of
/// the same source and config (each patch set rebuilds it incrementally),
/// so it is `None` once another patch set was built there after `kernel`.
pub fn objects_of(
    cache: &KernelCache,
    req: &BuildRequest,
    kernel: &BuiltKernel,
) -> Result<Option<PathBuf>, BuildError> {
    let fragment_paths = req.fragment_paths();
    let fragments = fragment_paths
        .iter()
        .map(|p| {
            Ok(HashedFile {
                path: p.clone(),
                sha256: source::file_hash(p)?,
            })
        })
        .collect::<Result<Vec<_>, BuildError>>()?;
    let slot = slot_of(req, &fragments);
    let build_root = cache.root().join("build");
    let out = if req.patches.is_empty() {
        build_root.join("out").join(&slot)
    } else {
        build_root
            .join("patched")
            .join(&slot)
            .join("out")
            .join(&slot)
    };
    let image = out.join(req.image_target().0);
    match source::file_hash(&image) {
        Ok(h) if h == kernel.record.image_sha256 => Ok(Some(out)),
        _ => Ok(None),
    }
}

/// Builds (or finds) the kernel `req` describes: identify it, reuse it when
/// already built, else prepare the tree, configure, compile and install.
pub fn build(
    cache: &KernelCache,
    req: &BuildRequest,
    progress: &mut dyn FnMut(BuildEvent),
) -> Result<BuiltKernel, BuildError> {
    let (pristine, source_identity) =
        source::pristine_tree(cache, &req.source, &req.fetch, progress)?;
    let patches = hashed_files(&req.patches)?;
    let fragment_paths = req.fragment_paths();
    let fragments = hashed_files(&fragment_paths)?;
    require_build_tools(req.arch)?;
    let gcc = format!("{}gcc", make::cross_prefix(req.arch));
    let tools = Toolchain {
        compiler: tool_version(&gcc, "--version"),
        pahole: tool_version("pahole", "--version"),
    };
    let id = build_id(req, &source_identity, &tools, &patches, &fragments)?;
    let final_dir = kernels_dir(cache).join(&id);
    if let Ok(k) = lookup(cache, &id) {
        if k.record.id == id {
            return Ok(k);
        }
    }

    let slot = slot_of(req, &fragments);
    let build_root = cache.root().join("build");
    let _lock = SlotLock::take(&build_root.join("locks"), &slot)?;
    let (src, out) = build_dirs(
        req,
        &pristine,
        &build_root,
        &slot,
        &source_identity,
        progress,
    )?;
    std::fs::create_dir_all(&out).doing(format!("creating {}", out.display()))?;
    let incremental = out.join("vmlinux").is_file();
    let log = out.join("build.log");
    let _ = std::fs::remove_file(&log);
    let jobs = req.jobs.max(1);
    let make = make::Make {
        src: &src,
        out: &out,
        jobs,
        log: &log,
        arch: req.arch,
    };

    let config_path = out.join(".config");
    let requested = kconfig::read_fragments(&fragment_paths)?;
    let kconfig_inputs = configure(
        req,
        &make,
        &fragment_paths,
        &fragments,
        &tools,
        &requested,
        progress,
    )?;
    let resolved = KernelConfig::from_file(&config_path)?;
    let notes = check_config_survived(req, &requested, &resolved, &kconfig_inputs, config_path)?;

    let (build_secs, release) = compile(&make, incremental, progress)?;
    let control_modules = controls::build_if_asked(&make, req, &resolved, progress)?;

    let tmp = stage_files(cache, &id, &out, &log, req.image_target().0)?;
    controls::stage(&tmp, &control_modules)?;
    let record = BuildRecord {
        id: id.clone(),
        source: req.source.label(),
        source_identity,
        patches,
        base: req.base,
        fragments,
        config_sha256: resolved.content_hash(),
        compiler: tools.compiler,
        pahole: tools.pahole,
        release,
        image_sha256: source::file_hash(&tmp.join("bzImage"))?,
        build_secs,
        incremental,
        notes,
    };
    publish(&tmp, &final_dir, &record)?;
    Ok(BuiltKernel {
        dir: final_dir,
        record,
        cached: false,
    })
}

/// The versions of the tools that decide a kernel's bytes: part of its id
/// and of the configure stamp.
struct Toolchain {
    compiler: String,
    pahole: String,
}

/// Each of `paths` with its sha256 (the path canonical when it can be).
fn hashed_files(paths: &[PathBuf]) -> Result<Vec<HashedFile>, BuildError> {
    paths
        .iter()
        .map(|p| {
            Ok(HashedFile {
                path: p.canonicalize().unwrap_or_else(|_| p.clone()),
                sha256: source::file_hash(p)?,
            })
        })
        .collect()
}

/// Refuses before any work when a tool the kernel build needs is missing,
/// naming the Debian package that provides it.
fn require_build_tools(arch: kloop_protocol::Arch) -> Result<(), BuildError> {
    if which("gcc").is_none() {
        return Err(BuildError::ToolMissing {
            tool: "gcc",
            package: "gcc",
        });
    }
    if arch == kloop_protocol::Arch::Arm64 && which("aarch64-linux-gnu-gcc").is_none() {
        return Err(BuildError::ToolMissing {
            tool: "aarch64-linux-gnu-gcc",
            package: "gcc-aarch64-linux-gnu",
        });
    }
    for (tool, package) in [
        ("flex", "flex"),
        ("bison", "bison"),
        ("bc", "bc"),
        ("pahole", "dwarves"),
        ("zstd", "zstd"),
        ("lz4", "lz4"),
        ("patch", "patch"),
    ] {
        if which(tool).is_none() {
            return Err(BuildError::ToolMissing { tool, package });
        }
    }
    Ok(())
}

/// The kernel's id: a hash of everything that decides its bytes (see the
/// module's documentation).
fn build_id(
    req: &BuildRequest,
    source_identity: &str,
    tools: &Toolchain,
    patches: &[HashedFile],
    fragments: &[HashedFile],
) -> Result<String, BuildError> {
    let mut id_parts: Vec<String> = vec![
        "kloop-build-1".into(),
        source_identity.to_string(),
        req.base.target().into(),
        tools.compiler.clone(),
        tools.pahole.clone(),
    ];
    if req.arch != kloop_protocol::Arch::X86_64 {
        id_parts.push(format!("arch:{}", req.arch));
    }
    id_parts.extend(patches.iter().map(|p| format!("patch:{}", p.sha256)));
    id_parts.extend(fragments.iter().map(|f| format!("fragment:{}", f.sha256)));
    if let Some(dir) = &req.controls {
        id_parts.push(format!("controls:{}", controls::sources_hash(dir)?));
    }
    Ok(short_hash(&id_parts.iter().map(String::as_str).collect::<Vec<_>>())[..12].to_string())
}

/// The source tree to build and its output directory: the pristine tree,
/// or a patched copy of it in the slot.
fn build_dirs(
    req: &BuildRequest,
    pristine: &Path,
    build_root: &Path,
    slot: &str,
    source_identity: &str,
    progress: &mut dyn FnMut(BuildEvent),
) -> Result<(PathBuf, PathBuf), BuildError> {
    // A patched copy sits at the same path relative to its output
    // directory as the pristine tree does to its own
    // (`../../src/<id>/<name>`): ccache, told to hash paths relative to
    // the build directory, then serves a patched build every object the
    // patches did not touch.
    if req.patches.is_empty() {
        return Ok((pristine.to_path_buf(), build_root.join("out").join(slot)));
    }
    progress(BuildEvent::Phase(format!(
        "applying {} patch(es)",
        req.patches.len()
    )));
    let root = build_root.join("patched").join(slot);
    let rel = pristine
        .strip_prefix(build_root)
        .map(Path::to_path_buf)
        .unwrap_or_else(|_| PathBuf::from("src/tree"));
    let tree = source::patched_tree(
        pristine,
        &root,
        &root.join(rel),
        source_identity,
        &req.patches,
        progress,
    )?;
    Ok((tree, root.join("out").join(slot)))
}

/// Writes the output directory's `.config`: the base target merged with the
/// requested fragments, unless the stamp says it already is. Returns the
/// tree's Kconfig inputs, which the survival check indexes.
fn configure(
    req: &BuildRequest,
    make: &make::Make<'_>,
    fragment_paths: &[PathBuf],
    fragments: &[HashedFile],
    tools: &Toolchain,
    requested: &[kconfig::Requested],
    progress: &mut dyn FnMut(BuildEvent),
) -> Result<kconfig::KconfigInputs, BuildError> {
    let fragment_list = fragment_paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ");
    let config_path = make.out.join(".config");
    // Configuring is two `make`s (~8 s on 2 cores) whose result depends
    // only on the stamp's inputs: an output directory configured from the
    // same ones (every validate candidate after the first, when its patch
    // touches no Kconfig) keeps its `.config`. The stamp also holds the
    // `.config`'s hash, so a `.config` changed since is configured again;
    // it is removed before configuring and written after, so a killed
    // configure leaves none.
    let stamp_path = make.out.join(".kloop-configured");
    let fragment_hashes: Vec<&str> = fragments.iter().map(|f| f.sha256.as_str()).collect();
    let ld = tool_version("ld", "--version");
    let rustc = tool_version("rustc", "--version");
    let mut settings = vec![
        "kloop-config-stamp-1",
        req.base.target(),
        tools.compiler.as_str(),
        tools.pahole.as_str(),
        ld.as_str(),
        rustc.as_str(),
    ];
    settings.extend(fragment_hashes);
    let arch_dir = match make.arch {
        kloop_protocol::Arch::X86_64 => "x86",
        kloop_protocol::Arch::Arm64 => "arm64",
    };
    let kconfig_inputs = kconfig::KconfigInputs::read_for(make.src, arch_dir);
    let inputs = kconfig_inputs.stamp(&settings);
    let stamp_of = |inputs: &str| -> Option<String> {
        Some(format!(
            "{inputs} {}",
            source::file_hash(&config_path).ok()?
        ))
    };
    let configured = std::fs::read_to_string(&stamp_path)
        .ok()
        .is_some_and(|s| Some(s.trim()) == stamp_of(&inputs).as_deref());
    if configured {
        progress(BuildEvent::Phase(format!(
            "configured: {} + {fragment_list}, as for the last build in this directory (the \
             same Kconfig files, fragments and tools)",
            req.base.target(),
        )));
        return Ok(kconfig_inputs);
    }
    let _ = std::fs::remove_file(&stamp_path);
    progress(BuildEvent::Phase(format!(
        "configuring: {} + {fragment_list}",
        req.base.target(),
    )));
    make.run(&[req.base.target()], progress)?;
    let base = std::fs::read_to_string(&config_path)
        .doing(format!("reading {}", config_path.display()))?;
    std::fs::write(&config_path, kconfig::merge(&base, requested))
        .doing(format!("writing {}", config_path.display()))?;
    make.run(&["olddefconfig"], progress)?;
    if let Some(stamp) = stamp_of(&inputs) {
        // Costs only the next build's configure when it cannot be written.
        let _ = crate::write_atomically(&stamp_path, stamp.as_bytes());
    }
    Ok(kconfig_inputs)
}

/// Refuses a `.config` that dropped a requested option; returns the notes
/// for options of kloop's own fragment this tree does not know, which are
/// expected across kernel versions and only noted.
fn check_config_survived(
    req: &BuildRequest,
    requested: &[kconfig::Requested],
    resolved: &KernelConfig,
    kconfig_inputs: &kconfig::KconfigInputs,
    config_path: PathBuf,
) -> Result<Vec<String>, BuildError> {
    let index = kconfig::KconfigIndex::of(kconfig_inputs);
    let mut notes = Vec::new();
    let mut dropped = Vec::new();
    for d in kconfig::check_survival(requested, resolved, &index) {
        if d.unknown && d.requested.from == req.kloop_fragment {
            notes.push(d.to_string());
        } else {
            dropped.push(d.to_string());
        }
    }
    if !dropped.is_empty() {
        return Err(BuildError::ConfigDropped {
            dropped,
            config: config_path,
        });
    }
    Ok(notes)
}

/// `make bzImage`: returns how long it took and the kernel's release.
fn compile(
    make: &make::Make<'_>,
    incremental: bool,
    progress: &mut dyn FnMut(BuildEvent),
) -> Result<(f64, String), BuildError> {
    progress(BuildEvent::Phase(format!(
        "compiling ({}, {} jobs{})",
        if incremental {
            "incremental: the output directory holds an earlier build"
        } else {
            "full: a fresh output directory"
        },
        make.jobs,
        if make::has_ccache() { ", ccache" } else { "" }
    )));
    let started = Instant::now();
    let target = match make.arch {
        kloop_protocol::Arch::X86_64 => "bzImage",
        kloop_protocol::Arch::Arm64 => "Image",
    };
    make.run(&[target], progress)?;
    let build_secs = started.elapsed().as_secs_f64();
    let release = std::fs::read_to_string(make.out.join("include/config/kernel.release"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Ok((build_secs, release))
}

/// Copies the finished kernel's files into a fresh partial directory beside
/// `kernels/<id>/`, which `publish` renames into place.
fn stage_files(
    cache: &KernelCache,
    id: &str,
    out: &Path,
    log: &Path,
    image: &str,
) -> Result<PathBuf, BuildError> {
    let tmp = kernels_dir(cache).join(format!(".partial-{id}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).doing(format!("creating {}", tmp.display()))?;
    let copy = |from: &Path, name: &str| {
        std::fs::copy(from, tmp.join(name))
            .map(drop)
            .doing(format!("copying {}", from.display()))
    };
    // Kept as `bzImage` whatever the architecture: the cache's one name
    // for a built kernel's image (an arm64 one is its `Image`).
    copy(&out.join(image), "bzImage")?;
    copy(&out.join(".config"), "config")?;
    copy(log, "build.log")?;
    Ok(tmp)
}

/// Writes `kernel.toml` into the staged directory and renames it to
/// `final_dir`, so `kernels/<id>/` is either whole or absent.
fn publish(tmp: &Path, final_dir: &Path, record: &BuildRecord) -> Result<(), BuildError> {
    let text = toml::to_string_pretty(record)
        .map_err(|e| BuildError::Invalid(format!("serialising kernel.toml: {e}")))?;
    std::fs::write(tmp.join("kernel.toml"), text).doing(format!("writing {}", tmp.display()))?;
    let _ = std::fs::remove_dir_all(final_dir);
    std::fs::rename(tmp, final_dir).doing(format!("renaming {} into place", tmp.display()))?;
    Ok(())
}

/// `tool` on `PATH`, if any.
pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(tool))
            .find(|p| p.is_file())
    })
}

/// An exclusive `flock` on one slot, so two builds never share a tree or
/// an output directory; released when dropped (or when the process dies).
/// The lock file names its holder, which a refused build says.
struct SlotLock {
    _lock: crate::lock::HolderLock,
}

impl SlotLock {
    fn take(dir: &Path, slot: &str) -> Result<SlotLock, BuildError> {
        std::fs::create_dir_all(dir).doing(format!("creating {}", dir.display()))?;
        let path = dir.join(slot);
        match crate::lock::HolderLock::try_take(&path)
            .doing(format!("locking {}", path.display()))?
        {
            Some(l) => Ok(SlotLock { _lock: l }),
            None => Err(BuildError::Invalid(format!(
                "another kloop build is using this source's build directory: {} holds its lock {}; wait for it to finish",
                crate::lock::holder(&path).unwrap_or_else(|| "another process".into()),
                path.display()
            ))),
        }
    }
}

#[cfg(test)]
mod slot_lock_tests {
    use super::*;

    /// A second build of the same source is refused naming the build that
    /// holds the directory (here this very process, through another open).
    #[test]
    fn a_busy_build_directory_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let _held = SlotLock::take(dir.path(), "linux-source-6.1.lock").unwrap();
        let e = SlotLock::take(dir.path(), "linux-source-6.1.lock")
            .err()
            .expect("the slot is held")
            .to_string();
        assert!(
            e.contains(&format!(
                "another kloop build is using this source's build directory: pid {} (",
                std::process::id()
            )),
            "{e}"
        );
    }
}
