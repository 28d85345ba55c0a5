//! Perf side-band listeners: `perf_event_open` + ring buffers, drained raw.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Result};
use kloop_protocol::{records_frames, ListenerSpec};

use crate::channel;
use crate::sys::OsContext;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_DUMMY: u64 = 9;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

// Bit positions in perf_event_attr's flag word (include/uapi/linux/perf_event.h).
const ATTR_SAMPLE_ID_ALL: u64 = 1 << 18;
const ATTR_KSYMBOL: u64 = 1 << 29;
const ATTR_BPF_EVENT: u64 = 1 << 30;

/// `struct perf_event_attr` up to `PERF_ATTR_SIZE_VER5`, which every kernel
/// with KSYMBOL/BPF_EVENT (5.1+) accepts.
#[repr(C)]
#[derive(Default)]
pub(crate) struct PerfEventAttr {
    pub(crate) type_: u32,
    pub(crate) size: u32,
    pub(crate) config: u64,
    pub(crate) sample_period: u64,
    pub(crate) sample_type: u64,
    pub(crate) read_format: u64,
    pub(crate) flags: u64,
    pub(crate) wakeup_events: u32,
    pub(crate) bp_type: u32,
    pub(crate) config1: u64,
    pub(crate) config2: u64,
    pub(crate) branch_sample_type: u64,
    pub(crate) sample_regs_user: u64,
    pub(crate) sample_stack_user: u32,
    pub(crate) clockid: i32,
    pub(crate) sample_regs_intr: u64,
    pub(crate) aux_watermark: u32,
    pub(crate) sample_max_stack: u16,
    pub(crate) reserved_2: u16,
}

pub(crate) const PERF_ATTR_SIZE_VER5: u32 = 112;
const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == PERF_ATTR_SIZE_VER5 as usize);

/// `perf_event_open(attr, pid, cpu, group_fd = -1, FD_CLOEXEC)`. Pointers
/// in `attr` (a kprobe's function name in `config1`) must stay valid for
/// the call.
pub(crate) fn perf_event_open(
    attr: &PerfEventAttr,
    pid: libc::pid_t,
    cpu: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: attr is a valid perf_event_attr of the size it announces
    // (every caller sets PERF_ATTR_SIZE_VER5, the struct's size).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            pid,
            cpu,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

// Offsets in `struct perf_event_mmap_page`.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

pub struct Ring {
    pub index: u32,
    pub cpu: i32,
    _fd: OwnedFd,
    base: *mut u8,
    map_len: usize,
    data_offset: usize,
    data_size: usize,
    /// Bytes of this listener already sent (the next chunk's stream offset).
    pub sent: u64,
}

// The mapping is only touched by the thread that owns the Ring.
unsafe impl Send for Ring {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

impl Ring {
    /// A CPU-wide listener on `cpu` (`pid = -1`).
    pub fn open(index: u32, cpu: u32, spec: &ListenerSpec) -> Result<Ring> {
        Ring::open_on(index, -1, cpu as i32, spec)
    }

    /// A listener bound to the calling thread on any CPU (`pid = 0`,
    /// `cpu = -1`): it sees the side-band records the kernel emits while
    /// this thread runs (its own loads and the unloads its closes cause).
    pub fn open_task(index: u32, spec: &ListenerSpec) -> Result<Ring> {
        Ring::open_on(index, 0, -1, spec)
    }

    fn open_on(index: u32, pid: libc::pid_t, cpu: i32, spec: &ListenerSpec) -> Result<Ring> {
        if spec.ring_pages == 0 || !spec.ring_pages.is_power_of_two() {
            bail!("ring_pages must be a power of two, got {}", spec.ring_pages);
        }
        let mut flags = ATTR_SAMPLE_ID_ALL; // disabled = 0: enabled from the start
        if spec.ksymbol {
            flags |= ATTR_KSYMBOL;
        }
        if spec.bpf_event {
            flags |= ATTR_BPF_EVENT;
        }
        let attr = PerfEventAttr {
            type_: PERF_TYPE_SOFTWARE,
            size: PERF_ATTR_SIZE_VER5,
            config: PERF_COUNT_SW_DUMMY,
            sample_type: spec.sample_type,
            flags,
            ..Default::default()
        };
        let fd = perf_event_open(&attr, pid, cpu as libc::c_int).os_ctx(format!(
            "perf_event_open(dummy, sample_type={:#x}, ksymbol={}, bpf_event={}, pid={pid}, cpu={cpu})",
            spec.sample_type, spec.ksymbol, spec.bpf_event
        ))?;
        let psz = page_size();
        let map_len = (1 + spec.ring_pages as usize) * psz;
        // SAFETY: mapping a perf fd; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error()).os_ctx(format!(
                "mmap of {} ring pages for listener (pid {pid}, cpu {cpu})",
                spec.ring_pages
            ));
        }
        let base = base as *mut u8;
        let mut ring = Ring {
            index,
            cpu,
            _fd: fd,
            base,
            map_len,
            data_offset: psz,
            data_size: spec.ring_pages as usize * psz,
            sent: 0,
        };
        // data_offset/data_size exist since 4.1; fall back to the classic layout.
        let (off, size) = (ring.read_u64(DATA_OFFSET), ring.read_u64(DATA_SIZE));
        if off != 0 && size != 0 {
            ring.data_offset = off as usize;
            ring.data_size = size as usize;
        }
        Ok(ring)
    }

    pub fn ring_bytes(&self) -> u64 {
        self.data_size as u64
    }

    fn atomic(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offset is inside the first (control) page, 8-aligned.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    fn read_u64(&self, offset: usize) -> u64 {
        self.atomic(offset).load(Ordering::Relaxed)
    }

    /// Copies the unread bytes `[data_tail, data_head)`; returns them and the
    /// head to commit with [`Ring::commit`] once they are sent.
    pub fn unread(&self) -> Result<(Vec<u8>, u64)> {
        // Acquire pairs with the kernel's smp_wmb before it publishes data_head.
        let head = self.atomic(DATA_HEAD).load(Ordering::Acquire);
        let tail = self.atomic(DATA_TAIL).load(Ordering::Relaxed);
        let len = head.wrapping_sub(tail);
        if len > self.data_size as u64 {
            bail!(
                "ring of listener {} (cpu {}): head {head} is {len} bytes past tail {tail}, more than the {}-byte ring",
                self.index,
                self.cpu,
                self.data_size
            );
        }
        let len = len as usize;
        let mut out = Vec::with_capacity(len);
        let start = (tail % self.data_size as u64) as usize;
        let first = len.min(self.data_size - start);
        // SAFETY: both ranges lie inside the data area of the mapping.
        unsafe {
            let data = self.base.add(self.data_offset);
            out.extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
            out.extend_from_slice(std::slice::from_raw_parts(data, len - first));
        }
        Ok((out, head))
    }

    /// Releases everything up to `head` back to the kernel.
    pub fn commit(&self, head: u64) {
        // Release: our reads of the data happen before the kernel may reuse it.
        self.atomic(DATA_TAIL).store(head, Ordering::Release);
    }
}

/// Sends one ring's unread bytes to the host and releases them to the
/// kernel; returns the bytes sent.
pub fn drain_ring(ring: &mut Ring) -> Result<Vec<u8>> {
    let (bytes, head) = ring.unread()?;
    for frame in records_frames(ring.index, ring.sent, &bytes) {
        channel::send_frame(&frame).os_ctx("writing records to the data port")?;
    }
    ring.sent += bytes.len() as u64;
    ring.commit(head);
    Ok(bytes)
}

/// [`drain_ring`] for every ring; returns the number of bytes sent.
pub fn drain_all(rings: &mut [Ring]) -> Result<u64> {
    let mut total = 0;
    for ring in rings {
        total += drain_ring(ring)?.len() as u64;
    }
    Ok(total)
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}
