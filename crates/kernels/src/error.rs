//! Errors of the kernel module: each names the cause and the next step.

use std::path::PathBuf;

use kloop_path_io::PathIo;

/// The `what` of a [`KernelError::CacheRead`]'s `PathIo`.
pub(crate) const READING: &str = "reading from the kernel cache";

/// Everything that can go wrong while loading pins or fetching kernels.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The catalog (its directory, a pin, the bisect lock) could not be
    /// read.
    #[error("{0}; run from the workspace root or pass the path of the `kernels/` directory")]
    CatalogRead(#[source] PathIo),

    #[error("no kernel pins found in {dir}; create one with `cargo xtask kernels update <id>`")]
    EmptyCatalog { dir: PathBuf },

    #[error(
        "{file} looks like a kernel pin but does not parse: {message}; fix the file or \
         re-create it with `cargo xtask kernels update <id>`"
    )]
    PinParse { file: PathBuf, message: String },

    #[error(
        "{file} is not a valid kernel pin: {message}; fix the file or re-create it with \
         `cargo xtask kernels update <id>`"
    )]
    PinInvalid { file: PathBuf, message: String },

    #[error("no kernel pin with id `{id}`; valid ids: {valid}")]
    UnknownPin { id: String, valid: String },

    /// A pin file (or the bisect lock) could not be written.
    #[error("{0}; make the `kernels/` directory writable and run the command again")]
    PinWrite(#[source] PathIo),

    #[error(
        "cannot find the Debian mirror in the host's apt sources: {detail}; set \
         KLOOP_MIRROR to the URL of a Debian mirror (the archive root that holds `dists/` \
         and `pool/`: the URI of a Debian host's `deb … main` line)"
    )]
    NoMirror { detail: String },

    /// Only Debian's own apt sources name Debian's archive: another
    /// distribution's mirror serves that distribution's kernels, not the
    /// pinned packages.
    #[error(
        "this host runs {name}, whose apt sources name its own archive, not Debian's, \
         and kloop's kernels are Debian packages; set KLOOP_MIRROR to the URL of a Debian \
         mirror (the archive root that holds `dists/` and `pool/`: the URI of a Debian \
         host's `deb … main` line; in GitHub Actions, a repository variable KLOOP_MIRROR \
         passed to the job's environment)"
    )]
    NotDebianHost { name: String },

    #[error(
        "cannot choose a cache directory: none of KLOOP_CACHE_DIR, XDG_CACHE_HOME or HOME \
         is set; set KLOOP_CACHE_DIR to a writable directory"
    )]
    NoCacheDir,

    #[error(transparent)]
    Io(#[from] PathIo),

    /// A write into the cache failed: the message says whether for want
    /// of space (with what is free), of permission, or else. It quotes
    /// the OS error itself, so the `PathIo` is not its `source` (a printed
    /// chain would repeat it in `PathIo`'s own words).
    #[error("{}", crate::space::write_problem(.0))]
    CacheWrite(PathIo),

    /// The cache cannot take a run: read-only, or too little free.
    #[error(transparent)]
    Room(#[from] crate::space::RoomError),

    /// A file of the kernel cache could not be read (its `PathIo` says
    /// [`READING`]).
    #[error(
        "{0}; delete it (it will be fetched again) or set KLOOP_CACHE_DIR to another \
         directory"
    )]
    CacheRead(#[source] PathIo),

    #[error(
        "the cached file {path} for kernel `{id}` was corrupt (sha256 {actual}, pin expects \
         {expected}) and has been removed; offline mode forbids fetching it again: run once \
         with network access"
    )]
    CorruptOffline {
        id: String,
        path: PathBuf,
        expected: String,
        actual: String,
    },

    #[error(
        "kernel `{id}` is not in the cache (looked for {path}) and offline mode forbids \
         downloading it; run once with network access to fill the cache"
    )]
    NotCached { id: String, path: PathBuf },

    #[error("`{tool}` is not installed; install the Debian package `{package}` (apt-get install {package})")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },

    #[error("`{command}` failed ({status}): {stderr}; {hint}")]
    ToolFailed {
        command: String,
        status: String,
        stderr: String,
        hint: &'static str,
    },

    #[error(
        "could not fetch the package index of suite `{suite}` from {mirror}: {detail}; \
         check network access to the mirror or set KLOOP_MIRROR (kernels already in the \
         cache keep working without network)"
    )]
    IndexUnavailable {
        suite: String,
        mirror: String,
        detail: String,
    },

    #[error(
        "the mirror {mirror} does not serve suite `{suite}` any more: {detail}; re-pin with \
         `cargo xtask kernels update <id>` after changing the suite, or set KLOOP_MIRROR to \
         an archive mirror that still has it"
    )]
    SuiteGone {
        suite: String,
        mirror: String,
        detail: String,
    },

    #[error(
        "the Release file of suite `{suite}` from {mirror} does not verify against the \
         keyring {keyring}: {detail}; creating or updating a pin needs a verified index: \
         install a newer `debian-archive-keyring` package or set KLOOP_KEYRING to a keyring \
         holding the archive key"
    )]
    UnverifiedIndex {
        suite: String,
        mirror: String,
        keyring: PathBuf,
        detail: String,
    },

    #[error(
        "the mirror no longer serves {package}={version} ({origin}) for kernel `{id}`, and \
         the cache does not have it; run `cargo xtask kernels update {id}` to re-pin it to a \
         version the mirror serves"
    )]
    Vanished {
        id: String,
        package: String,
        version: String,
        /// e.g. "suite `sid` on http://…/debian"
        origin: String,
    },

    #[error(
        "kernel `{id}` was pinned without {package}={version}, which holds its {what}: the \
         mirror did not serve it then; run `cargo xtask kernels pin-build {id}` once the \
         mirror serves it (or with KLOOP_MIRROR set to an archive that still does)"
    )]
    CompanionUnserved {
        id: String,
        package: String,
        version: String,
        /// `modules`, `.config`.
        what: &'static str,
    },

    #[error(
        "the package {file} downloaded for kernel `{id}` has sha256 {actual}, but the pin \
         expects {expected}; refusing it (kept at {file} for inspection). The mirror serves \
         different bytes for the pinned version: check the mirror, or re-pin deliberately \
         with `cargo xtask kernels update {id}`"
    )]
    DebHashMismatch {
        id: String,
        file: PathBuf,
        expected: String,
        actual: String,
    },

    #[error(
        "the image {member} for kernel `{id}` has sha256 {actual}, but the pin expects \
         {expected}; refusing it. Check `image_path` / `image_sha256` in kernels/{id}.toml or \
         re-pin with `cargo xtask kernels update {id}`"
    )]
    ImageHashMismatch {
        id: String,
        /// e.g. "boot/vmlinuz-… in /…/debs/<sha>.deb"
        member: String,
        expected: String,
        actual: String,
    },

    #[error(
        "{archive} contains the entry `{entry}` whose path escapes the extraction root; \
         refusing to extract from it. The package is malformed or hostile: delete it and \
         check the mirror"
    )]
    PathEscape { archive: PathBuf, entry: String },

    #[error(
        "{archive} has no regular file `{member}` (kernel images seen: {found}); fix \
         `image_path` in the pin or re-pin with `cargo xtask kernels update <id>`"
    )]
    MemberMissing {
        archive: PathBuf,
        member: String,
        found: String,
    },

    #[error(
        "no package of {family} in {origin} carries a kernel image (candidates: \
         {candidates}); check `series` and `suite` for pin `{id}`"
    )]
    NoCandidate {
        id: String,
        /// e.g. "series 6.1, flavour cloud-amd64"
        family: String,
        /// e.g. "suite `sid` on http://…/debian"
        origin: String,
        candidates: String,
    },

    #[error("{path} is not a usable kernel image: {reason}; check the pin's `image_path`")]
    BadImage { path: PathBuf, reason: String },

    /// A guest tool's pin (`kernels/tools/<arch>/<package>.toml`) is
    /// missing or does not parse.
    #[error(
        "cannot use the guest tool pin {path}: {detail}; restore it from git (each names a \
         Debian package, its version, suite and the .deb's sha256 from the signed index)"
    )]
    NoToolPin { path: PathBuf, detail: String },

    #[error("{path} is not the package its guest tool pin names: {reason}; delete it from the cache so it is downloaded again, or fix the pin")]
    BadToolPackage { path: PathBuf, reason: String },

    #[error(
        "kernel `{id}` has no module `{module}`: {archive} holds no `{module}.ko*` for its \
         release and {detail}; check the scenario's `modules` list (names as `modprobe` takes \
         them)"
    )]
    ModuleMissing {
        id: String,
        module: String,
        archive: PathBuf,
        /// What modules.builtin said (or that the package has none), similar names.
        detail: String,
    },

    #[error(
        "module `{module}` of kernel `{id}` depends on `{dependency}`, which {archive} does \
         not hold: the package is incomplete"
    )]
    ModuleDependencyMissing {
        id: String,
        module: String,
        dependency: String,
        archive: PathBuf,
    },

    #[error("module `{module}` ({member} in {archive}) is unusable: {reason}")]
    BadModule {
        module: String,
        member: String,
        archive: PathBuf,
        reason: String,
    },
}

impl KernelError {
    /// The mirror does not serve what was asked (a package or version it
    /// no longer has, or lists without serving), as opposed to a failure
    /// on the way (network, a tool, a hash, the cache).
    pub fn is_unserved(&self) -> bool {
        matches!(
            self,
            KernelError::Vanished { .. }
                | KernelError::NoCandidate { .. }
                | KernelError::CompanionUnserved { .. }
        )
    }
}
