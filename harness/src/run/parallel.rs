//! How many trials run at once.
//!
//! One VM per core keeps a TCG host busy only while every guest computes,
//! but many trials spend much of their time waiting in the guest: RCU-tasks
//! grace periods before a trampoline's symbol goes, the kprobe optimizer's
//! delayed worker, nanosleeps. On 2 cores a warm matrix with one VM per
//! core left ~17 CPU-seconds idle of ~115 (sampled from /proc/stat), most
//! of it in the first half, where the slowest trials, which are also the
//! ones that wait, run together. A fixed third VM filled that (median wall
//! 65.6 → 58.8 s over three runs each) but also overloads the phases where
//! every guest computes. So beyond one VM per core, kloop starts another
//! trial only while the host has had a quarter of a core idle over the
//! last half second, up to half as many again; `--jobs N` keeps exactly N.

use std::time::{Duration, Instant};

/// How many VMs run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parallel {
    /// Always allowed to run.
    pub vms: usize,
    /// Started beyond `vms` only while the host idles.
    pub extra: usize,
}

impl Parallel {
    /// Exactly `n` VMs (`--jobs N`), at least one.
    pub fn jobs(n: usize) -> Parallel {
        Parallel {
            vms: n.max(1),
            extra: 0,
        }
    }

    /// One VM per core, and up to half as many again while the host idles.
    pub fn host_default() -> Parallel {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Parallel {
            vms: cores,
            extra: cores.div_ceil(2),
        }
    }

    /// `--jobs` if given, else [`Parallel::host_default`].
    pub fn from_flag(jobs: Option<usize>) -> Parallel {
        jobs.map_or_else(Parallel::host_default, Parallel::jobs)
    }

    pub fn max_vms(&self) -> usize {
        self.vms + self.extra
    }
}

/// What a user gets without `--jobs`.
impl Default for Parallel {
    fn default() -> Parallel {
        Parallel::host_default()
    }
}

impl std::fmt::Display for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.extra {
            0 => write!(f, "{} VM(s) at once", self.vms),
            n => write!(
                f,
                "{} VM(s) at once, up to {n} more while the host idles",
                self.vms
            ),
        }
    }
}

/// The idle time that lets one more VM start. With one VM per core busy,
/// a 2-core host sampled 0.05-0.15 idle cores (kloop's own gaps between
/// trials); while the waiting trials ran, 0.3-0.8.
pub(crate) const IDLE_CORES_FOR_EXTRA: f64 = 0.25;
/// How long an extra VM's start is given to show in the idle figure before
/// the next extra one may start.
pub(crate) const EXTRA_SETTLE: Duration = Duration::from_millis(500);

/// Whether a trial may start now: within `vms` always; beyond it, up to
/// `vms + extra`, only if the host idled `idle_cores` (cores' worth over
/// the last window, `None` when unknown) and the last extra start is
/// [`EXTRA_SETTLE`] old.
pub(crate) fn may_start(
    running: usize,
    par: Parallel,
    idle_cores: Option<f64>,
    last_extra: Option<Duration>,
) -> bool {
    if running < par.vms {
        return true;
    }
    running < par.max_vms()
        && idle_cores.is_some_and(|idle| idle >= IDLE_CORES_FOR_EXTRA)
        && last_extra.is_none_or(|ago| ago >= EXTRA_SETTLE)
}

/// The host's idle CPU time, from /proc/stat: its first line's idle and
/// iowait jiffies against all of them, over the CPUs it sums (its `cpuN`
/// lines: every online CPU, which may be more than this process may use).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CpuTimes {
    idle: u64,
    total: u64,
    cpus: usize,
}

impl CpuTimes {
    /// The `cpu` line of /proc/stat's text.
    pub(crate) fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().next()?;
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let values: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice]:
        // guest time is already inside user and nice.
        let idle = values.get(3)? + values.get(4)?;
        let total = values.iter().take(8).sum();
        let cpus = stat
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("cpu"))
            .count();
        (cpus > 0).then_some(CpuTimes { idle, total, cpus })
    }

    fn read() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Idle cores' worth between `earlier` and `self`.
    pub(crate) fn idle_cores_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let idle = self.idle.checked_sub(earlier.idle)?;
        (total > 0).then(|| idle as f64 / total as f64 * self.cpus as f64)
    }
}

/// The host's idle cores over roughly the last [`WINDOW`], sampled by
/// [`IdleSampler::sample`] every [`TICK`].
pub(crate) struct IdleSampler {
    samples: std::collections::VecDeque<(Instant, CpuTimes)>,
}

pub(crate) const TICK: Duration = Duration::from_millis(100);
const WINDOW: Duration = Duration::from_millis(500);

impl IdleSampler {
    pub(crate) fn new() -> IdleSampler {
        IdleSampler {
            samples: Default::default(),
        }
    }

    /// Reads /proc/stat now; a host without it never starts extra VMs.
    pub(crate) fn sample(&mut self) {
        let now = Instant::now();
        if let Some(t) = CpuTimes::read() {
            self.samples.push_back((now, t));
        }
        while self
            .samples
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > WINDOW)
            && self.samples.len() > 2
        {
            self.samples.pop_front();
        }
    }

    /// Idle cores over the window, once it spans most of one.
    pub(crate) fn idle_cores(&self) -> Option<f64> {
        let (first_at, first) = self.samples.front()?;
        let (last_at, last) = self.samples.back()?;
        if last_at.duration_since(*first_at) < WINDOW * 3 / 4 {
            return None;
        }
        last.idle_cores_since(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_vms_start_only_while_the_host_idles_and_one_at_a_time() {
        let par = Parallel { vms: 2, extra: 1 };
        let settled = Some(EXTRA_SETTLE);
        assert!(may_start(0, par, None, None));
        assert!(may_start(1, par, Some(0.0), None), "within one per core");
        assert!(!may_start(2, par, Some(0.2), settled), "busy host");
        assert!(!may_start(2, par, None, settled), "idle unknown");
        assert!(may_start(2, par, Some(0.8), settled));
        assert!(may_start(2, par, Some(0.8), None));
        assert!(
            !may_start(2, par, Some(1.9), Some(Duration::from_millis(100))),
            "the last extra VM has not shown yet"
        );
        assert!(!may_start(3, par, Some(2.0), settled), "at the most");
        assert!(
            !may_start(2, Parallel::jobs(2), Some(2.0), settled),
            "--jobs 2"
        );
    }

    #[test]
    fn host_default_keeps_one_per_core_and_adds_half() {
        let p = Parallel::host_default();
        assert!(p.vms >= 1);
        assert_eq!(p.extra, p.vms.div_ceil(2));
        assert_eq!(Parallel::from_flag(Some(3)), Parallel { vms: 3, extra: 0 });
        assert_eq!(Parallel::from_flag(Some(0)).vms, 1);
        assert_eq!(Parallel::from_flag(None), p);
    }

    /// /proc/stat's first lines as this host's kernel (6.18) writes them.
    #[test]
    fn idle_cores_come_from_the_cpu_lines_idle_and_iowait() {
        let before = CpuTimes::parse(
            "cpu  1853824 6927 389624 1664370 26748 0 2534 5657 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n",
        )
        .unwrap();
        // 100 jiffies pass on each of 2 CPUs: 50 user, 120 idle, 30 iowait.
        let after = CpuTimes::parse(
            "cpu  1853874 6927 389624 1664490 26778 0 2534 5657 0 0\ncpu0 1\ncpu1 1\nintr 5\n",
        )
        .unwrap();
        let idle = after.idle_cores_since(&before).unwrap();
        assert!((idle - 1.5).abs() < 1e-9, "{idle}");
        assert_eq!(before.idle_cores_since(&after), None, "time ran backwards");
        assert_eq!(CpuTimes::parse("intr 1 2\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 2\n"), None);
        assert_eq!(
            CpuTimes::parse("cpu  1 2 3 4 5 6 7 8 0 0\n"),
            None,
            "no CPU counted"
        );
    }
}
