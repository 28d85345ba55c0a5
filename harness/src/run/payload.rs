//! Host programs shipped into the guest's initramfs, with every shared
//! library they need.
//!
//! The guest has no root file system: a dynamically linked host binary runs
//! there only if its ELF interpreter and each library the loader resolves on
//! the host sit at the same paths in the initramfs. The loader in the guest
//! has no `/etc/ld.so.cache`, so it searches its built-in directories
//! (`/lib/x86_64-linux-gnu`, `/usr/lib/x86_64-linux-gnu` on Debian), which is
//! where `ldd` finds them on the host.
//!
//! Two payloads exist: `perf` for scenarios that `require` the
//! `perf-tool` feature (the real perf as a second, independent reader of the
//! side-band records), and busybox for `vm-shell`'s interactive guest.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use kloop_path_io::{PathIo, PathIoExt};
use thiserror::Error;

/// Where the guest finds perf (the `perf-tool` probe runs it from there).
pub const GUEST_PERF: &str = "/usr/bin/perf";

/// The host's perf, unless `KLOOP_PERF` names another binary.
pub const HOST_PERF: &str = "/usr/bin/perf";

/// Where the guest finds busybox (`vm-shell`); its applets link to it.
pub const GUEST_BUSYBOX: &str = "/bin/busybox";

/// The host's busybox (Debian's `busybox-static`), unless `KLOOP_BUSYBOX`
/// names another.
pub const HOST_BUSYBOX: &str = "/bin/busybox";

#[derive(Debug, Error)]
pub enum PayloadError {
    #[error(
        "vm-shell runs busybox's shell in the guest, but {path} does not exist on this host; \
         install it with `apt-get install busybox-static` (or run ci/setup.sh), \
         or point KLOOP_BUSYBOX at a busybox binary"
    )]
    BusyboxMissing { path: PathBuf },
    #[error("no busybox for the {arch} guest: {why}")]
    GuestBusybox {
        arch: kloop_protocol::Arch,
        why: String,
    },
    #[error("asking {path} for its applets (`busybox --list-full`): {what}")]
    BusyboxApplets { path: PathBuf, what: String },
    #[error(
        "the scenario needs perf in the guest, but {path} does not exist on this host; \
         run ci/setup.sh, or install it (Debian: `apt-get install linux-perf`; Ubuntu: \
         `apt-get install linux-tools-common linux-tools-$(uname -r)`), or point KLOOP_PERF \
         at a perf binary"
    )]
    PerfMissing { path: PathBuf },
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error(
        "{wrapper} is a wrapper script and no perf binary is behind it (neither \
         /usr/bin/perf_<version> nor /usr/lib/linux-tools/<release>/perf); run ci/setup.sh, \
         or install one (Debian: `apt-get install linux-perf`; Ubuntu: `apt-get install \
         linux-tools-$(uname -r)`), or point KLOOP_PERF at the binary"
    )]
    NoRealPerf { wrapper: PathBuf },
    #[error("{path} is not an ELF executable the guest can run: {what}")]
    NotElf { path: PathBuf, what: String },
    #[error("running ldd on {path}: {what}")]
    Ldd { path: PathBuf, what: String },
    #[error("building {source_file} with `gcc -static` failed (install gcc and the C library's static archive: `apt-get install gcc libc6-dev linux-libc-dev`):\n{output}")]
    Compile {
        source_file: PathBuf,
        output: String,
    },
}

/// One file to ship: where it goes in the guest and where its bytes are on
/// the host (symlinks resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadFile {
    pub guest_path: String,
    pub host_path: PathBuf,
    pub mode: u32,
}

/// A set of files for the initramfs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload {
    pub files: Vec<PayloadFile>,
}

impl Payload {
    /// Every directory the files need, parents first (the kernel's initramfs
    /// unpacker does not create missing parents).
    pub fn dirs(&self) -> Vec<String> {
        let mut dirs = BTreeSet::new();
        for f in &self.files {
            let mut p = Path::new(&f.guest_path).parent();
            while let Some(d) = p {
                let s = d.to_string_lossy().trim_start_matches('/').to_string();
                if s.is_empty() {
                    break;
                }
                dirs.insert(s);
                p = d.parent();
            }
        }
        let mut dirs: Vec<String> = dirs.into_iter().collect();
        dirs.sort_by_key(|d| (d.matches('/').count(), d.clone()));
        dirs
    }

    /// Total bytes of the shipped files.
    pub fn bytes(&self) -> Result<u64, PayloadError> {
        let mut total = 0;
        for f in &self.files {
            total += std::fs::metadata(&f.host_path)
                .at("reading", &f.host_path)?
                .len();
        }
        Ok(total)
    }
}

/// The perf binary `KLOOP_PERF` names, when it names one: a perf other than
/// the host's (a build with a fix), so the ledger's perf bugs that do not
/// show with it are notes, not `FIXED?` (`run::trial::judging`).
pub fn perf_override() -> Option<PathBuf> {
    std::env::var_os("KLOOP_PERF")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// The perf binary to ship: `KLOOP_PERF`, else `/usr/bin/perf`, resolved
/// through Debian's or Ubuntu's wrapper script if it is one; on Ubuntu
/// without the wrapper, the binary `linux-tools-<release>` installs.
pub fn host_perf() -> Result<PathBuf, PayloadError> {
    let path = std::env::var_os("KLOOP_PERF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(HOST_PERF));
    if !path.exists() {
        if std::env::var_os("KLOOP_PERF").is_none() {
            if let Some(p) = ubuntu_perf(Path::new(UBUNTU_TOOLS), &host_release()) {
                return Ok(p);
            }
        }
        return Err(PayloadError::PerfMissing { path });
    }
    let head = read_head(&path, 4)?;
    if head.starts_with(b"#!") {
        return real_perf_behind_wrapper(&path);
    }
    Ok(path)
}

/// Where Ubuntu's `linux-tools-<release>` packages put perf: one directory
/// per kernel release, each with its own `perf`.
pub const UBUNTU_TOOLS: &str = "/usr/lib/linux-tools";

fn host_release() -> String {
    kloop_qemu::accel::host_release()
}

/// Behind a wrapper script: older Debian releases install `/usr/bin/perf`
/// as a script that execs `perf_<major.minor>` for the running kernel;
/// Ubuntu's `linux-tools-common` as one that execs
/// `/usr/lib/linux-tools/<release>/perf`. The guest runs other kernels, so
/// any real binary serves: the running kernel's if there is one, else the
/// newest.
fn real_perf_behind_wrapper(wrapper: &Path) -> Result<PathBuf, PayloadError> {
    let dir = wrapper.parent().unwrap_or(Path::new("/usr/bin"));
    let entries = std::fs::read_dir(dir).at("reading", dir)?;
    let mut best: Option<(Vec<u32>, PathBuf)> = None;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(ver) = name.strip_prefix("perf_") else {
            continue;
        };
        let Ok(nums) = ver
            .split('.')
            .map(str::parse::<u32>)
            .collect::<Result<Vec<u32>, _>>()
        else {
            continue;
        };
        let path = e.path();
        if is_elf(&path) && best.as_ref().is_none_or(|(b, _)| nums > *b) {
            best = Some((nums, path));
        }
    }
    best.map(|(_, p)| p)
        .or_else(|| ubuntu_perf(Path::new(UBUNTU_TOOLS), &host_release()))
        .ok_or_else(|| PayloadError::NoRealPerf {
            wrapper: wrapper.to_path_buf(),
        })
}

/// `tools/<release>/perf` for the running kernel's `release`, else the
/// one of the newest release (by its numbers: `6.8.0-1021-azure` →
/// 6, 8, 0, 1021).
fn ubuntu_perf(tools: &Path, release: &str) -> Option<PathBuf> {
    let own = tools.join(release).join("perf");
    if is_elf(&own) {
        return Some(own);
    }
    let mut best: Option<(Vec<u64>, PathBuf)> = None;
    for e in std::fs::read_dir(tools).ok()?.flatten() {
        let perf = e.path().join("perf");
        let nums: Vec<u64> = e
            .file_name()
            .to_string_lossy()
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        if is_elf(&perf) && best.as_ref().is_none_or(|(b, _)| nums > *b) {
            best = Some((nums, perf));
        }
    }
    best.map(|(_, p)| p)
}

fn is_elf(path: &Path) -> bool {
    read_head(path, 4).is_ok_and(|h| h.starts_with(b"\x7fELF"))
}

fn read_head(path: &Path, n: usize) -> Result<Vec<u8>, PayloadError> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    let mut f = std::fs::File::open(path).at("reading", path)?;
    let got = f.read(&mut buf).at("reading", path)?;
    buf.truncate(got);
    Ok(buf)
}

/// The perf payload: the binary at [`GUEST_PERF`], its ELF interpreter and
/// every library `ldd` resolves, each at the path the guest's loader will
/// look for it.
pub fn perf_payload() -> Result<Payload, PayloadError> {
    let perf = host_perf()?;
    binary_payload(&perf, GUEST_PERF)
}

/// busybox for the guest shell: the binary at [`GUEST_BUSYBOX`] (with its
/// interpreter and libraries if it is not the static build), and the guest
/// path of every applet it has (`bin/sh`, `usr/bin/awk`, …), for links to it.
pub fn busybox_payload() -> Result<(Payload, Vec<String>), PayloadError> {
    let path = host_busybox()?;
    busybox_payload_of(&path, kloop_protocol::Arch::X86_64, &path)
}

/// The host's busybox: `KLOOP_BUSYBOX`, else [`HOST_BUSYBOX`].
fn host_busybox() -> Result<PathBuf, PayloadError> {
    let path = std::env::var_os("KLOOP_BUSYBOX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(HOST_BUSYBOX));
    if !path.is_file() {
        return Err(PayloadError::BusyboxMissing { path });
    }
    Ok(path)
}

/// busybox for a guest of `arch` in `env`: the host's for x86-64; for
/// another architecture `KLOOP_BUSYBOX_<ARCH>` (`KLOOP_BUSYBOX_ARM64`) or
/// Debian's static busybox of that architecture, pinned in
/// `kernels/tools/<arch>/busybox-static.toml` and fetched on first use.
/// Its applets are the host's busybox's (the host cannot run it; the pin
/// keeps the host's version).
/// `kernels_dir` is where the pins are, or why this run has none for
/// `arch` (see `TrialEnv::busybox`).
pub fn busybox_payload_for(
    arch: kloop_protocol::Arch,
    cache: &kloop_kernels::KernelCache,
    kernels_dir: Result<&Path, String>,
    fetch: &kloop_kernels::FetchOptions,
) -> Result<(Payload, Vec<String>), PayloadError> {
    let var = match arch {
        kloop_protocol::Arch::X86_64 => return busybox_payload(),
        kloop_protocol::Arch::Arm64 => "KLOOP_BUSYBOX_ARM64",
    };
    let guest = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => {
            let kernels = kernels_dir.map_err(|why| PayloadError::GuestBusybox { arch, why })?;
            kloop_kernels::guest_tool::guest_tool(cache, kernels, arch, "busybox-static", fetch)
                .map_err(|e| PayloadError::GuestBusybox {
                    arch,
                    why: format!("{e} (or point {var} at a static {arch} busybox)"),
                })?
        }
    };
    busybox_payload_of(&guest, arch, &host_busybox()?)
}

/// `binary` as the guest's busybox, with the applets `lister` (a busybox
/// the host runs) names.
fn busybox_payload_of(
    binary: &Path,
    arch: kloop_protocol::Arch,
    lister: &Path,
) -> Result<(Payload, Vec<String>), PayloadError> {
    let path = binary.to_path_buf();
    if !path.is_file() {
        return Err(PayloadError::BusyboxMissing { path });
    }
    let bytes = std::fs::read(&path).at("reading", &path)?;
    let interpreter = elf_interpreter_of(&bytes, arch).map_err(|what| PayloadError::NotElf {
        path: path.clone(),
        what,
    })?;
    if let (Some(interp), false) = (&interpreter, arch == kloop_protocol::Arch::X86_64) {
        // The libraries shipped beside a dynamic binary are the host's.
        return Err(PayloadError::NotElf {
            path,
            what: format!(
                "it is dynamic (interpreter {interp}); an {arch} guest needs a static busybox"
            ),
        });
    }
    let payload = match interpreter {
        None => Payload {
            files: vec![PayloadFile {
                guest_path: GUEST_BUSYBOX.to_string(),
                host_path: std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone()),
                mode: 0o755,
            }],
        },
        Some(_) => binary_payload(&path, GUEST_BUSYBOX)?,
    };
    let out = Command::new(lister)
        .arg("--list-full")
        .output()
        .map_err(|e| PayloadError::BusyboxApplets {
            path: lister.to_path_buf(),
            what: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(PayloadError::BusyboxApplets {
            path: lister.to_path_buf(),
            what: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    let applets = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty() && !l.contains(".."))
        .collect();
    Ok((payload, applets))
}

/// `binary` shipped as `guest_path`, with its interpreter and libraries.
pub fn binary_payload(binary: &Path, guest_path: &str) -> Result<Payload, PayloadError> {
    let bytes = std::fs::read(binary).at("reading", binary)?;
    let interp = elf_interpreter(&bytes).map_err(|what| PayloadError::NotElf {
        path: binary.to_path_buf(),
        what,
    })?;
    let mut files = vec![PayloadFile {
        guest_path: guest_path.to_string(),
        host_path: binary.to_path_buf(),
        mode: 0o755,
    }];
    let mut seen: BTreeSet<String> = BTreeSet::from([guest_path.to_string()]);
    let mut add = |guest: String, mode: u32, files: &mut Vec<PayloadFile>| {
        if seen.insert(guest.clone()) {
            files.push(PayloadFile {
                host_path: PathBuf::from(&guest),
                guest_path: guest,
                mode,
            });
        }
    };
    if let Some(interp) = interp {
        add(interp, 0o755, &mut files);
    }
    for lib in ldd(binary)? {
        add(lib, 0o644, &mut files);
    }
    for f in &mut files {
        // Ship the bytes behind symlinks (`/lib64/ld-linux-x86-64.so.2` ->
        // `/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2`) under the linked name.
        f.host_path = std::fs::canonicalize(&f.host_path).at("reading", &f.host_path)?;
    }
    Ok(Payload { files })
}

/// The `PT_INTERP` path of a 64-bit little-endian x86-64 ELF file (`None`
/// for a static binary), read with the `object` crate.
pub fn elf_interpreter(elf: &[u8]) -> Result<Option<String>, String> {
    elf_interpreter_of(elf, kloop_protocol::Arch::X86_64)
}

/// [`elf_interpreter`] of a binary for guests of `arch`.
pub fn elf_interpreter_of(
    elf: &[u8],
    arch: kloop_protocol::Arch,
) -> Result<Option<String>, String> {
    use object::elf::{FileHeader64, EM_AARCH64, EM_X86_64, PT_INTERP};
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::LittleEndian;

    let header = FileHeader64::<LittleEndian>::parse(elf)
        .map_err(|e| format!("not a 64-bit little-endian ELF file: {e}"))?;
    let endian = header
        .endian()
        .map_err(|e| format!("not a 64-bit little-endian ELF file: {e}"))?;
    let machine = header.e_machine(endian);
    let want = match arch {
        kloop_protocol::Arch::X86_64 => EM_X86_64,
        kloop_protocol::Arch::Arm64 => EM_AARCH64,
    };
    if machine != want {
        return Err(format!("e_machine is {machine}, not {arch}'s ({want})"));
    }
    let headers = header
        .program_headers(endian, elf)
        .map_err(|e| format!("program headers: {e}"))?;
    if let Some(ph) = headers.iter().find(|ph| ph.p_type(endian) == PT_INTERP) {
        let raw = ph.data(endian, elf).map_err(|()| {
            format!(
                "PT_INTERP at {:#x}+{} runs past the file",
                ph.p_offset(endian),
                ph.p_filesz(endian)
            )
        })?;
        let path = raw.split(|b| *b == 0).next().unwrap_or_default();
        let path = std::str::from_utf8(path).map_err(|_| "PT_INTERP is not UTF-8")?;
        if !path.starts_with('/') {
            return Err(format!("PT_INTERP {path:?} is not an absolute path"));
        }
        return Ok(Some(path.to_string()));
    }
    Ok(None)
}

/// Absolute library paths `ldd` resolves for `binary` (interpreter
/// included, the vDSO excluded). A library it cannot find is an error: the
/// binary would not start in the guest either.
fn ldd(binary: &Path) -> Result<Vec<String>, PayloadError> {
    let out = Command::new("ldd")
        .arg(binary)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| PayloadError::Ldd {
            path: binary.to_path_buf(),
            what: format!("cannot run ldd: {e} (it comes with libc-bin)"),
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(PayloadError::Ldd {
            path: binary.to_path_buf(),
            what: format!(
                "ldd {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                stdout.trim()
            ),
        });
    }
    parse_ldd(&stdout).map_err(|what| PayloadError::Ldd {
        path: binary.to_path_buf(),
        what,
    })
}

/// Parses `ldd` output: `libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x…)`,
/// `/lib64/ld-linux-x86-64.so.2 (0x…)`, `linux-vdso.so.1 (0x…)`.
pub fn parse_ldd(text: &str) -> Result<Vec<String>, String> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some((name, rest)) = line.split_once("=>") {
            let path = rest.trim().split(" (").next().unwrap_or("").trim();
            if path == "not found" {
                return Err(format!(
                    "library {} not found on the host (`{line}`)",
                    name.trim()
                ));
            }
            if path.starts_with('/') {
                libs.push(path.to_string());
            } else if !path.is_empty() {
                return Err(format!("unexpected ldd line `{line}`"));
            }
            // `name =>  (0x…)`: a library without a file (vDSO on old glibc).
        } else {
            let path = line.split(" (").next().unwrap_or("").trim();
            if path.starts_with('/') {
                libs.push(path.to_string());
            } else if !path.starts_with("linux-vdso") && !path.starts_with("linux-gate") {
                return Err(format!("unexpected ldd line `{line}`"));
            }
        }
    }
    Ok(libs)
}

/// Builds the C program `source` statically (`gcc -static -O2 -Wall`, the
/// source's folder on the include path) into `cache` under the hash of the
/// source and the headers beside it, once: a cached binary is reused, a new
/// one is written under a temporary name and renamed into place.
pub fn c_program(source: &Path, cache: &Path) -> Result<PathBuf, PayloadError> {
    c_program_for(source, cache, kloop_protocol::Arch::X86_64)
}

/// [`c_program`] for a guest of `arch`: x86-64's with the host's gcc,
/// arm64's with Debian's cross compiler (`aarch64-linux-gnu-gcc`, glibc's
/// static archives from libc6-dev-arm64-cross; `ci/setup.sh --arch arm64`),
/// cached apart.
pub fn c_program_for(
    source: &Path,
    cache: &Path,
    arch: kloop_protocol::Arch,
) -> Result<PathBuf, PayloadError> {
    use sha2::{Digest, Sha256};
    let read = |path: &Path| std::fs::read(path).at("reading", path);
    let dir = source.parent().unwrap_or(Path::new("."));
    let mut hash = Sha256::new();
    hash.update(read(source)?);
    let mut headers: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "h"))
        .collect();
    headers.sort();
    for h in &headers {
        hash.update(h.to_string_lossy().as_bytes());
        hash.update(read(h)?);
    }
    // x86-64's key is what it was before other architectures came.
    if arch != kloop_protocol::Arch::X86_64 {
        hash.update(arch.as_str().as_bytes());
    }
    let key: String = hash
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let stem = source
        .file_stem()
        .map_or("program".into(), |s| s.to_string_lossy().into_owned());
    let out = cache.join(&key).join(&stem);
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(cache.join(&key)).at("creating", cache.join(&key))?;
    let tmp = cache
        .join(&key)
        .join(format!("{stem}.{}.tmp", std::process::id()));
    let compiler = arch.c_compiler();
    let run = Command::new(compiler)
        .args(["-static", "-O2", "-Wall", "-Wextra", "-I"])
        .arg(dir)
        .arg("-o")
        .arg(&tmp)
        .arg(source)
        .output();
    let compile_error = |output: String| PayloadError::Compile {
        source_file: source.to_path_buf(),
        output,
    };
    match run {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(compile_error(
                String::from_utf8_lossy(&o.stderr).into_owned(),
            ));
        }
        Err(e) => return Err(compile_error(format!("running {compiler}: {e}"))),
    }
    std::fs::rename(&tmp, &out).at("renaming into", &out)?;
    Ok(out)
}

/// A scenario's `[[programs]]`, built and placed where it asks.
pub fn programs_payload(
    programs: &[crate::scenario::GuestProgram],
    cache: &Path,
    arch: kloop_protocol::Arch,
) -> Result<Payload, PayloadError> {
    let mut files = Vec::new();
    for p in programs {
        files.push(PayloadFile {
            guest_path: p.guest.clone(),
            host_path: c_program_for(&p.source, cache, arch)?,
            mode: 0o755,
        });
    }
    Ok(Payload { files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_library_paths_and_interpreter() {
        // From `ldd /usr/bin/perf` on Debian 12 (perf 6.1.192), abridged.
        let text = "\tlinux-vdso.so.1 (0x00007ff756686000)\n\
            \tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007ff756595000)\n\
            \tlibelf.so.1 => /lib/x86_64-linux-gnu/libelf.so.1 (0x00007ff756566000)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007ff75501e000)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007ff756688000)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            vec![
                "/lib/x86_64-linux-gnu/libm.so.6",
                "/lib/x86_64-linux-gnu/libelf.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2",
            ]
        );
    }

    #[test]
    fn missing_library_is_an_error() {
        let e = parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert!(e.contains("libfoo.so.1"), "{e}");
    }

    #[test]
    fn interpreter_of_a_host_binary_and_none_for_non_elf() {
        // `ldd` itself is a script on Debian; `/bin/sh` is a dynamic ELF.
        let sh = std::fs::read(std::fs::canonicalize("/bin/sh").unwrap()).unwrap();
        let interp = elf_interpreter(&sh).unwrap().expect("/bin/sh is dynamic");
        assert!(
            interp.starts_with('/') && interp.contains("ld-linux"),
            "{interp}"
        );
        assert!(elf_interpreter(b"#!/bin/sh\n").is_err());
    }

    #[test]
    fn ubuntu_perf_is_the_running_kernels_else_the_newest() {
        let tools = tempfile::tempdir().unwrap();
        let put = |release: &str, bytes: &[u8]| {
            let d = tools.path().join(release);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("perf"), bytes).unwrap();
        };
        put("6.5.0-9-generic", b"\x7fELF...");
        put("6.8.0-1021-azure", b"\x7fELF...");
        put("6.11.0-1-generic", b"#!/bin/sh\n");
        std::fs::create_dir_all(tools.path().join("7.0.0-1-generic")).unwrap();
        let found = |release: &str| {
            ubuntu_perf(tools.path(), release)
                .map(|p| p.strip_prefix(tools.path()).unwrap().display().to_string())
        };
        assert_eq!(
            found("6.5.0-9-generic").as_deref(),
            Some("6.5.0-9-generic/perf")
        );
        // Scripts and directories without perf are not candidates.
        assert_eq!(
            found("6.11.0-1-generic").as_deref(),
            Some("6.8.0-1021-azure/perf")
        );
        assert_eq!(ubuntu_perf(&tools.path().join("none"), "x"), None);
    }

    #[test]
    fn dirs_come_parents_first() {
        let p = Payload {
            files: vec![
                PayloadFile {
                    guest_path: "/usr/bin/perf".into(),
                    host_path: "/x".into(),
                    mode: 0o755,
                },
                PayloadFile {
                    guest_path: "/lib/x86_64-linux-gnu/libc.so.6".into(),
                    host_path: "/y".into(),
                    mode: 0o644,
                },
                PayloadFile {
                    guest_path: "/lib64/ld-linux-x86-64.so.2".into(),
                    host_path: "/z".into(),
                    mode: 0o755,
                },
            ],
        };
        assert_eq!(
            p.dirs(),
            vec!["lib", "lib64", "usr", "lib/x86_64-linux-gnu", "usr/bin"]
        );
    }
}
