//! Perf side-band listeners: `perf_event_open` + ring buffers, drained raw.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Result};
use kloop_protocol::{records_frames, ListenerSpec, SideBand};

use crate::channel;
use crate::sys::OsContext;

/// `struct perf_event_attr` and `struct perf_event_mmap_page` as aya's
/// bindings generate them from `include/uapi/linux/perf_event.h`.
pub use aya_obj::generated::{perf_event_attr, perf_event_mmap_page};
use aya_obj::generated::{perf_sw_ids, perf_type_id, PERF_FLAG_FD_CLOEXEC};

/// `PERF_ATTR_SIZE_VER5` (the uapi header's `#define`, which bindgen does
/// not carry): the attr size every kernel with KSYMBOL/BPF_EVENT (5.1+)
/// accepts. The bindings' struct is larger (later versions' fields); the
/// kernel reads only the `size` bytes an attr announces, and the fields
/// past VER5 stay zero anyway.
pub const PERF_ATTR_SIZE_VER5: u32 = 112;
const _: () = assert!(std::mem::offset_of!(perf_event_attr, aux_sample_size) == 112);

/// A zeroed `perf_event_attr` of `type_` and `config` announcing
/// [`PERF_ATTR_SIZE_VER5`]; callers set the rest.
pub fn event_attr(type_: u32, config: u64) -> perf_event_attr {
    // SAFETY: perf_event_attr is integers, integer unions and a bitfield;
    // all zeroes is a valid value (and `disabled` = 0: enabled at open).
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = type_;
    attr.size = PERF_ATTR_SIZE_VER5;
    attr.config = config;
    attr
}

/// `perf_event_open(attr, pid, cpu, group_fd = -1, FD_CLOEXEC)`. Pointers
/// in `attr` (a kprobe's function name in `config1`) must stay valid for
/// the call.
pub fn perf_event_open(
    attr: &perf_event_attr,
    pid: libc::pid_t,
    cpu: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: attr is a valid perf_event_attr at least as large as the size
    // it announces (PERF_ATTR_SIZE_VER5, from event_attr).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const perf_event_attr,
            pid,
            cpu,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

// Where the ring's control words are in its first page. Read and written
// at these offsets with atomics rather than through the struct: the kernel
// updates `data_head` concurrently.
const DATA_HEAD: usize = std::mem::offset_of!(perf_event_mmap_page, data_head);
const DATA_TAIL: usize = std::mem::offset_of!(perf_event_mmap_page, data_tail);
const DATA_OFFSET: usize = std::mem::offset_of!(perf_event_mmap_page, data_offset);
const DATA_SIZE: usize = std::mem::offset_of!(perf_event_mmap_page, data_size);
const _: () = assert!(DATA_HEAD == 1024 && DATA_SIZE == 1048);

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
    /// Opened with `PERF_FORMAT_LOST`: [`Ring::lost_samples`] can read it.
    lost_format: bool,
    /// A backward overwrite ring (`attr.write_backward`, mapped read-only).
    backward: bool,
    /// For a backward ring: the data_head of the last read (the kernel
    /// writes each new record just below the previous one).
    read_to: u64,
}

// The mapping is only touched by the thread that owns the Ring.
unsafe impl Send for Ring {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// `PERF_FORMAT_LOST` (include/uapi/linux/perf_event.h, Linux 6.0): a
/// read returns the event's `lost_samples` after its value.
const PERF_FORMAT_LOST: u64 = 1 << 4;

/// Whether the kernel refused `PERF_FORMAT_LOST` once (older than 6.0:
/// perf_copy_attr() refuses read_format bits it does not know), so that
/// later listeners do not ask again.
static NO_FORMAT_LOST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The side-band `PERF_COUNT_SW_DUMMY` event `spec` describes, opened for
/// `pid` on `cpu`; a listener maps its ring, an unmapped one
/// (`ring_pages = 0`) never does, so the kernel matches it for every
/// record and finds no buffer to write to. It asks for `PERF_FORMAT_LOST`
/// where the kernel has it; returns the fd and whether it has the format.
pub fn open_side_band(pid: libc::pid_t, cpu: i32, spec: &ListenerSpec) -> Result<(OwnedFd, bool)> {
    use std::sync::atomic::Ordering;
    let what = || {
        format!(
            "perf_event_open(dummy{}{}, sample_type={:#x}, ksymbol={}, bpf_event={}, inherit={}, side_band={:?}, pid={pid}, cpu={cpu})",
            if spec.ring_pages == 0 { " without a ring" } else { "" },
            if spec.disabled { ", disabled" } else { "" },
            spec.sample_type,
            spec.ksymbol,
            spec.bpf_event,
            spec.inherit,
            spec.side_band
        )
    };
    if !NO_FORMAT_LOST.load(Ordering::Relaxed) {
        match open_side_band_with(pid, cpu, spec, PERF_FORMAT_LOST) {
            Ok(fd) => return Ok((fd, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // Either the format or something else of the spec; the
                // open without it says which.
                let fd = open_side_band_with(pid, cpu, spec, 0).os_ctx(what())?;
                NO_FORMAT_LOST.store(true, Ordering::Relaxed);
                return Ok((fd, false));
            }
            Err(e) => return Err(e).os_ctx(what()),
        }
    }
    Ok((
        open_side_band_with(pid, cpu, spec, 0).os_ctx(what())?,
        false,
    ))
}

fn open_side_band_with(
    pid: libc::pid_t,
    cpu: i32,
    spec: &ListenerSpec,
    read_format: u64,
) -> io::Result<OwnedFd> {
    let mut attr = event_attr(
        perf_type_id::PERF_TYPE_SOFTWARE as u32,
        perf_sw_ids::PERF_COUNT_SW_DUMMY as u64,
    );
    attr.sample_type = spec.sample_type;
    attr.read_format = read_format;
    attr.set_sample_id_all(spec.sample_id_all.into());
    attr.set_ksymbol(spec.ksymbol.into());
    attr.set_bpf_event(spec.bpf_event.into());
    attr.set_inherit(spec.inherit.into());
    attr.set_disabled(spec.disabled.into());
    attr.set_write_backward(spec.backward.into());
    if spec.poll {
        // Every record wakes the waiter (a 1-byte watermark), and the
        // records' times are CLOCK_MONOTONIC like the waiter's.
        attr.set_watermark(1);
        attr.__bindgen_anon_2.wakeup_watermark = spec.poll_watermark.max(1);
        attr.set_use_clockid(1);
        attr.clockid = libc::CLOCK_MONOTONIC;
    }
    for bit in &spec.side_band {
        match bit {
            SideBand::Mmap => attr.set_mmap(1),
            SideBand::Comm => attr.set_comm(1),
            SideBand::Task => attr.set_task(1),
            SideBand::Namespaces => attr.set_namespaces(1),
            SideBand::Cgroup => attr.set_cgroup(1),
            SideBand::TextPoke => attr.set_text_poke(1),
        }
    }
    perf_event_open(&attr, pid, cpu as libc::c_int)
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

    /// A listener bound to the calling task on `cpu` (`pid = 0`): what an
    /// inherited listener needs, since the kernel refuses to mmap an
    /// inherited event that is not bound to a CPU.
    pub fn open_task_on(index: u32, cpu: u32, spec: &ListenerSpec) -> Result<Ring> {
        Ring::open_on(index, 0, cpu as i32, spec)
    }

    fn open_on(index: u32, pid: libc::pid_t, cpu: i32, spec: &ListenerSpec) -> Result<Ring> {
        if spec.ring_pages == 0 || !spec.ring_pages.is_power_of_two() {
            bail!("ring_pages must be a power of two, got {}", spec.ring_pages);
        }
        let (fd, lost_format) = open_side_band(pid, cpu, spec)?;
        Ring::map(
            index,
            pid,
            cpu,
            fd,
            lost_format,
            spec.ring_pages,
            spec.backward,
        )
    }

    /// A bell for [`wait_for_ksymbol`]: a CPU-wide KSYMBOL-only listener
    /// on `cpu` whose one-page ring wakes a poller at its first record.
    /// A side-band record wakes no poller before the ring is half full
    /// (`wakeup_events` counts samples only, perf_output_sample()); a
    /// `wakeup_watermark` of 1 byte (ring_buffer_init() takes it as the
    /// ring's watermark) makes every record wake it. No `sample_id_all`:
    /// on kernels with ksymbol-bpf-event-header-size-accumulates the bell,
    /// opened last and so written first, would otherwise grow the
    /// header.size of every record the scenario's own listeners get by
    /// its trailer's length.
    pub fn open_bell(cpu: u32) -> Result<Ring> {
        let mut attr = event_attr(
            perf_type_id::PERF_TYPE_SOFTWARE as u32,
            perf_sw_ids::PERF_COUNT_SW_DUMMY as u64,
        );
        attr.set_ksymbol(1);
        attr.set_watermark(1);
        attr.__bindgen_anon_2.wakeup_watermark = 1;
        let fd = perf_event_open(&attr, -1, cpu as libc::c_int).os_ctx(format!(
            "perf_event_open(dummy, ksymbol, wakeup_watermark=1, cpu={cpu})"
        ))?;
        Ring::map(u32::MAX, -1, cpu as i32, fd, false, 1, false)
    }

    /// Maps `ring_pages` data pages of the perf event `fd`.
    fn map(
        index: u32,
        pid: libc::pid_t,
        cpu: i32,
        fd: OwnedFd,
        lost_format: bool,
        ring_pages: u32,
        backward: bool,
    ) -> Result<Ring> {
        let psz = page_size();
        let map_len = (1 + ring_pages as usize) * psz;
        // SAFETY: mapping a perf fd; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                // A read-only mapping makes the ring an overwrite ring
                // (rb->overwrite: the kernel ignores data_tail), as
                // `perf record --overwrite` maps its backward rings.
                if backward {
                    libc::PROT_READ
                } else {
                    libc::PROT_READ | libc::PROT_WRITE
                },
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error()).os_ctx(format!(
                "mmap of {ring_pages} ring pages for listener (pid {pid}, cpu {cpu})"
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
            data_size: ring_pages as usize * psz,
            sent: 0,
            lost_format,
            backward,
            read_to: 0,
        };
        // data_offset/data_size exist since 4.1; fall back to the classic layout.
        let (off, size) = (ring.read_u64(DATA_OFFSET), ring.read_u64(DATA_SIZE));
        if off != 0 && size != 0 {
            ring.data_offset = off as usize;
            ring.data_size = size as usize;
        }
        Ok(ring)
    }

    /// Pauses or resumes the kernel's output into this ring.
    pub fn pause_output(&self, paused: bool) -> Result<()> {
        use aya_obj::generated::PERF_EVENT_IOC_PAUSE_OUTPUT;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self._fd);
        // SAFETY: an ioctl with an integer argument on our own perf fd.
        if unsafe {
            libc::ioctl(
                fd,
                PERF_EVENT_IOC_PAUSE_OUTPUT as libc::c_ulong,
                libc::c_ulong::from(paused),
            )
        } < 0
        {
            return Err(io::Error::last_os_error()).os_ctx(format!(
                "PERF_EVENT_IOC_PAUSE_OUTPUT({}) on listener {}",
                u8::from(paused),
                self.index
            ));
        }
        Ok(())
    }

    /// Enables an event opened `disabled` (`PERF_EVENT_IOC_ENABLE`).
    pub fn enable(&self) -> Result<()> {
        use aya_obj::generated::PERF_EVENT_IOC_ENABLE;
        // SAFETY: an ioctl without an argument on our own perf fd.
        if unsafe { libc::ioctl(self.raw_fd(), PERF_EVENT_IOC_ENABLE as libc::c_ulong, 0) } < 0 {
            return Err(io::Error::last_os_error())
                .os_ctx(format!("PERF_EVENT_IOC_ENABLE on listener {}", self.index));
        }
        Ok(())
    }

    /// The event's id (`PERF_EVENT_IOC_ID`), the one its records'
    /// sample_id `id` and `identifier` carry.
    pub fn event_id(&self) -> Result<u64> {
        use aya_obj::generated::PERF_EVENT_IOC_ID;
        let mut id = 0u64;
        // SAFETY: the ioctl writes one u64 through the pointer.
        if unsafe { libc::ioctl(self.raw_fd(), PERF_EVENT_IOC_ID as libc::c_ulong, &mut id) } < 0 {
            return Err(io::Error::last_os_error())
                .os_ctx(format!("PERF_EVENT_IOC_ID on listener {}", self.index));
        }
        Ok(id)
    }

    /// The data area, its first byte and its length (a power of two), for
    /// a reader that checks records where they lie
    /// (`steps::spin_read`). Valid while the ring lives.
    pub fn data_area(&self) -> (*mut u8, usize) {
        // SAFETY: data_offset lies inside the mapping.
        (unsafe { self.base.add(self.data_offset) }, self.data_size)
    }

    /// The control page's `data_head`, which the kernel stores.
    pub fn head_word(&self) -> &AtomicU64 {
        self.atomic(DATA_HEAD)
    }

    /// The control page's `data_tail`, which the reader stores.
    pub fn tail_word(&self) -> &AtomicU64 {
        self.atomic(DATA_TAIL)
    }

    pub fn ring_bytes(&self) -> u64 {
        self.data_size as u64
    }

    /// The event's fd, for a waiter that polls it while the ring lives.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self._fd)
    }

    fn atomic(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offset is inside the first (control) page, 8-aligned.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    fn read_u64(&self, offset: usize) -> u64 {
        self.atomic(offset).load(Ordering::Relaxed)
    }

    /// A backward ring's records written since the last read, oldest
    /// first, and the head they start at. The kernel moves data_head down
    /// by each record's size and writes the record at the new head
    /// (__perf_output_begin with `backward`), so the new records lie in
    /// `[head, read_to)`, newest first; they are reordered here so that the
    /// host reads one forward stream. Bytes that do not split into records
    /// are sent as they lie, for the host's parser to judge.
    fn unread_backward(&self) -> Result<(Vec<u8>, u64)> {
        let head = self.atomic(DATA_HEAD).load(Ordering::Acquire);
        let written = self.read_to.wrapping_sub(head);
        // A head that moved up instead of down is no backward ring.
        if written > (i64::MAX as u64) {
            bail!(
                "backward ring of listener {} (cpu {}): data_head {head:#x} moved up from \
                 {:#x} since the last read: the kernel wrote it forwards",
                self.index,
                self.cpu,
                self.read_to
            );
        }
        // More than the ring holds: the kernel overwrote the oldest records,
        // as an overwrite ring does (perf record --overwrite keeps the
        // newest ring-full). Only the records lying wholly in the ring-full
        // above head are intact.
        let len = written.min(self.data_size as u64) as usize;
        let start = (head % self.data_size as u64) as usize;
        let first = len.min(self.data_size - start);
        let mut raw = Vec::with_capacity(len);
        // SAFETY: both ranges lie inside the data area of the mapping.
        unsafe {
            let data = self.base.add(self.data_offset);
            raw.extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
            raw.extend_from_slice(std::slice::from_raw_parts(data, len - first));
        }
        let mut records = Vec::new();
        let mut off = 0usize;
        while off + 8 <= raw.len() {
            let size = usize::from(u16::from_le_bytes([raw[off + 6], raw[off + 7]]));
            if size < 8 || off + size > raw.len() {
                break;
            }
            records.push(&raw[off..off + size]);
            off += size;
        }
        let wrapped = written > self.data_size as u64;
        if off != raw.len() && !wrapped {
            return Ok((raw, head));
        }
        Ok((
            records
                .iter()
                .rev()
                .flat_map(|r| r.iter().copied())
                .collect(),
            head,
        ))
    }

    /// Copies the unread bytes `[data_tail, data_head)`; returns them and the
    /// head to commit with [`Ring::commit`] once they are sent.
    pub fn unread(&self) -> Result<(Vec<u8>, u64)> {
        if self.backward {
            return self.unread_backward();
        }
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
    if ring.backward {
        // Read-only: the kernel overwrites without looking at data_tail.
        ring.read_to = head;
    } else {
        ring.commit(head);
    }
    Ok(bytes)
}

impl Ring {
    /// The event's `lost_samples`, read with `PERF_FORMAT_LOST` (`value`,
    /// then `lost`: perf_read_one()); `None` without the format.
    pub fn lost_samples(&self) -> Result<Option<u64>> {
        if !self.lost_format {
            return Ok(None);
        }
        let mut buf = [0u64; 2];
        // SAFETY: reading at most 16 bytes into a 16-byte buffer.
        let n = unsafe {
            libc::read(
                std::os::fd::AsRawFd::as_raw_fd(&self._fd),
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(&buf),
            )
        };
        if n != 16 {
            return Err(io::Error::last_os_error()).os_ctx(format!(
                "read(PERF_FORMAT_LOST) of listener {} returned {n} bytes, not 16",
                self.index
            ));
        }
        Ok(Some(buf[1]))
    }
}

/// Sleeps until one of `bells` ([`Ring::open_bell`]) holds a record, or
/// `timeout` passes; empties them and returns each bell's bytes (records
/// without a sample_id trailer).
pub fn wait_for_ksymbol(bells: &[Ring], timeout: std::time::Duration) -> Result<Vec<Vec<u8>>> {
    let mut fds: Vec<libc::pollfd> = bells
        .iter()
        .map(|b| libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&b._fd),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e).os_ctx("poll on the KSYMBOL bells");
        }
    }
    bells
        .iter()
        .map(|bell| {
            let (bytes, head) = bell.unread()?;
            bell.commit(head);
            Ok(bytes)
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The flag word (the 64-bit bitfield after `read_format`) of an attr.
    fn flag_word(attr: &perf_event_attr) -> u64 {
        let offset = std::mem::offset_of!(perf_event_attr, read_format) + 8;
        // SAFETY: reading 8 initialised bytes inside the struct.
        unsafe {
            std::ptr::read_unaligned(
                (attr as *const perf_event_attr as *const u8).add(offset) as *const u64
            )
        }
    }

    /// The bindings' bitfield setters set the uapi bits the agent always
    /// set: disabled (0), sample_id_all (18), ksymbol (29), bpf_event (30).
    #[test]
    fn attr_flag_bits() {
        let mut attr = event_attr(1, 9);
        assert_eq!(flag_word(&attr), 0);
        attr.set_sample_id_all(1);
        attr.set_ksymbol(1);
        attr.set_bpf_event(1);
        assert_eq!(flag_word(&attr), (1 << 18) | (1 << 29) | (1 << 30));
        let mut disabled = event_attr(1, 9);
        disabled.set_disabled(1);
        assert_eq!(flag_word(&disabled), 1);
        assert_eq!(std::mem::offset_of!(perf_event_attr, sample_type), 24);
        assert_eq!(std::mem::offset_of!(perf_event_attr, bp_type), 52);
    }
}
