//! Small system helpers: errno names and error context, mounts, clocks,
//! uname, CPU lists and affinity.

use std::ffi::CString;
use std::fmt;
use std::fs;
use std::io;
use std::path::Path;

/// Symbolic name of an errno value (the common ones; the rest print as a number).
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ERANGE => "ERANGE",
        libc::ENOSYS => "ENOSYS",
        libc::ELOOP => "ELOOP",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ENFILE => "ENFILE",
        libc::EILSEQ => "EILSEQ",
        // Kernel-internal, but BPF leaks it to user space.
        524 => "ENOTSUPP",
        _ => return None,
    })
}

/// Formats an `io::Error` as `ENAME (description)` when it carries an errno.
pub struct Errno<'a>(pub &'a io::Error);

impl fmt::Display for Errno<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.raw_os_error() {
            Some(code) => {
                let desc = io::Error::from_raw_os_error(code).to_string();
                let desc = desc.split(" (os error").next().unwrap_or(&desc).to_owned();
                match errno_name(code) {
                    Some(name) => write!(f, "{name} ({desc})"),
                    None => write!(f, "errno {code} ({desc})"),
                }
            }
            None => write!(f, "{}", self.0),
        }
    }
}

/// `io::Result` → `anyhow::Result` with context and a symbolic errno.
pub trait OsContext<T> {
    fn os_ctx<C: fmt::Display>(self, what: C) -> anyhow::Result<T>;
}

impl<T> OsContext<T> for io::Result<T> {
    fn os_ctx<C: fmt::Display>(self, what: C) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::anyhow!("{what}: {}", Errno(&e)))
    }
}

/// Walks an error chain and names the errno of the first `io::Error` in it.
pub fn describe_chain(err: &anyhow::Error) -> String {
    let mut text = format!("{err:#}");
    for cause in err.chain() {
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            if io.raw_os_error().is_some() {
                text.push_str(&format!(" [{}]", Errno(io)));
                break;
            }
        }
    }
    text
}

pub fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

/// Mounts `fstype` on `target` (created if missing). `Ok(false)` if it was
/// already mounted (EBUSY).
pub fn mount(fstype: &str, target: &str) -> io::Result<bool> {
    fs::create_dir_all(target)?;
    let src = CString::new(fstype).unwrap();
    let tgt = CString::new(target).unwrap();
    let flags = libc::MS_NOSUID | libc::MS_NOEXEC | libc::MS_RELATIME;
    // SAFETY: valid NUL-terminated strings, null data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            src.as_ptr(),
            flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = last_os_error();
    if err.raw_os_error() == Some(libc::EBUSY) {
        return Ok(false);
    }
    Err(err)
}

/// Makes sure fds 0, 1 and 2 exist (the kernel leaves them closed when the
/// initramfs has no /dev/console node), so diagnostics reach the console.
pub fn ensure_console() {
    // SAFETY: plain fcntl probe.
    if unsafe { libc::fcntl(2, libc::F_GETFD) } != -1 {
        return;
    }
    let path = CString::new("/dev/console").unwrap();
    // SAFETY: valid path; fds are only dup'ed.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        if fd < 0 {
            return;
        }
        for target in 0..3 {
            if fd != target {
                libc::dup2(fd, target);
            }
        }
        if fd > 2 {
            libc::close(fd);
        }
    }
}

pub fn raise_memlock() -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid pointer to a rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
        return Err(last_os_error());
    }
    Ok(())
}

pub fn read_trimmed(path: impl AsRef<Path>) -> io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_owned())
}

/// The calling thread's id (`gettid(2)`; the libc wrapper needs glibc 2.30,
/// the syscall works everywhere).
pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    u32::try_from(tid).unwrap_or(0)
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn uname() -> kloop_protocol::Uname {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    unsafe { libc::uname(&mut u) };
    fn s(field: &[libc::c_char]) -> String {
        let bytes: Vec<u8> = field
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
    kloop_protocol::Uname {
        sysname: s(&u.sysname),
        release: s(&u.release),
        version: s(&u.version),
        machine: s(&u.machine),
    }
}

/// Parses a kernel CPU list such as `0-3,5,7-8`.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

pub fn online_cpus() -> io::Result<Vec<u32>> {
    let text = fs::read_to_string("/sys/devices/system/cpu/online")?;
    parse_cpu_list(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unparsable CPU list {text:?}"),
        )
    })
}

/// A CPU mask for `sched_{get,set}affinity`.
pub type CpuSet = libc::cpu_set_t;

/// Pins the calling thread to `cpu`; returns the previous mask.
pub fn pin_to(cpu: u32) -> anyhow::Result<CpuSet> {
    use anyhow::Context;
    // SAFETY: cpu_set_t is plain data; the libc macros index inside it.
    unsafe {
        let mut saved: CpuSet = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<CpuSet>(), &mut saved) != 0 {
            return Err(last_os_error()).os_ctx("sched_getaffinity");
        }
        let mut one: CpuSet = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut one);
        set_affinity(&one).with_context(|| format!("pinning to CPU {cpu}"))?;
        Ok(saved)
    }
}

/// `sched_setaffinity` of the calling thread.
pub fn set_affinity(mask: &CpuSet) -> anyhow::Result<()> {
    // SAFETY: a valid, initialised mask of the size passed.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<CpuSet>(), mask) } != 0 {
        return Err(last_os_error()).os_ctx("sched_setaffinity");
    }
    Ok(())
}

/// A reading of the clocks a step's [`kloop_protocol::StepCpu`] is the
/// difference of.
#[derive(Debug, Clone, Copy)]
pub struct CpuClocks {
    user_ns: u64,
    sys_ns: u64,
    idle_ns: u64,
    cpus: u32,
}

impl CpuClocks {
    /// Now, or `None` when `/proc` cannot tell (then the step reports no
    /// split rather than a wrong one).
    pub fn now() -> Option<CpuClocks> {
        let tv_ns = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
        let usage = |who| {
            // SAFETY: rusage is plain data that getrusage fills.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: a valid pointer to a rusage.
            (unsafe { libc::getrusage(who, &mut ru) } == 0).then_some(ru)
        };
        // RUSAGE_CHILDREN counts the children reaped so far: perf's time
        // lands in the step that waits for it.
        let own = usage(libc::RUSAGE_SELF)?;
        let children = usage(libc::RUSAGE_CHILDREN)?;
        let uptime = fs::read_to_string("/proc/uptime").ok()?;
        Some(CpuClocks {
            user_ns: tv_ns(own.ru_utime) + tv_ns(children.ru_utime),
            sys_ns: tv_ns(own.ru_stime) + tv_ns(children.ru_stime),
            idle_ns: parse_uptime_idle_ns(&uptime)?,
            cpus: online_cpus().ok()?.len() as u32,
        })
    }

    /// What happened between `self` and `later`.
    pub fn until(&self, later: &CpuClocks) -> kloop_protocol::StepCpu {
        kloop_protocol::StepCpu {
            user_ns: later.user_ns.saturating_sub(self.user_ns),
            sys_ns: later.sys_ns.saturating_sub(self.sys_ns),
            idle_ns: later.idle_ns.saturating_sub(self.idle_ns),
            cpus: later.cpus.max(self.cpus),
        }
    }
}

/// The second field of `/proc/uptime`: seconds every CPU spent idle, summed,
/// with two decimals (fs/proc/uptime.c).
fn parse_uptime_idle_ns(text: &str) -> Option<u64> {
    let idle = text.split_whitespace().nth(1)?;
    let (secs, frac) = idle.split_once('.').unwrap_or((idle, "0"));
    let frac_ns: u64 = format!("{frac:0<9}").get(..9)?.parse().ok()?;
    Some(secs.parse::<u64>().ok()? * 1_000_000_000 + frac_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_idle_is_the_second_field_in_ns() {
        assert_eq!(parse_uptime_idle_ns("12.34 20.05\n"), Some(20_050_000_000));
        assert_eq!(parse_uptime_idle_ns("0.50 0.07\n"), Some(70_000_000));
        assert_eq!(parse_uptime_idle_ns("12.34\n"), None);
        assert_eq!(parse_uptime_idle_ns("1.0 x.5\n"), None);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0\n"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(vec![0, 1, 2, 3, 6, 8, 9]));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn errno_formatting() {
        let e = io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(Errno(&e).to_string(), "EPERM (Operation not permitted)");
    }
}
