//! The BPF JIT's own books, read through /proc/kcore: the charge counter
//! `bpf_jit_current` and the chunk bitmap of every `bpf_prog_pack`
//! (kernel/bpf/core.c). No record shows them, yet every JIT image and
//! trampoline on the side-band paths is charged and carved out of them,
//! and a charge not returned or a chunk not given back is a leak a kernel
//! developer wants to hear of. Collected only: read before the first step
//! and after the plan, when everything the agent made is closed; the host
//! judges (`kloop_judge::jit_books`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kloop_protocol::{BooksMoment, ImageReading, JitReading, KsymReading, Message, PackReading};
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSegment, ReadCache};

/// The core-kernel symbols the books live in; read with the other core
/// symbols before a save.
pub const CORE_NAMES: [&str; 3] = [CURRENT, PACK_LIST, KALLSYMS_LIST];
const CURRENT: &str = "bpf_jit_current";
const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const PACK_LIST: &str = "pack_list";
/// kernel/bpf/core.c's list of every `bpf_ksym` (programs, trampolines,
/// dispatchers), in the order they were added.
const KALLSYMS_LIST: &str = "bpf_kallsyms";
/// A trampoline image's symbol (kernel/bpf/trampoline.c).
const TRAMPOLINE_PREFIX: &[u8] = b"bpf_trampoline_";
/// The most `bpf_ksym`s one reading walks.
const MAX_KSYMS: usize = 4096;

/// `BPF_PROG_CHUNK_SIZE` (1 << BPF_PROG_CHUNK_SHIFT, 6 from 5.18 to 7.x).
const CHUNK_SIZE: u64 = 64;
/// `BPF_PROG_PACK_SIZE` per possible NUMA node: `SZ_2M *
/// num_possible_nodes()` on x86-64 (PMD_SIZE is defined), 6.1 to 7.x.
const PACK_SIZE_PER_NODE: u64 = 2 << 20;
/// The most packs one reading follows (each is 2 MiB of executable
/// memory): a list longer than this is not what the pack allocator makes.
const MAX_PACKS: usize = 64;

/// How long the end reading waits for the counter to come back: programs
/// are freed after an RCU grace period from a workqueue
/// (bpf_prog_free_deferred), trampoline images after an RCU-tasks one
/// (bpf_tramp_image_put); under TCG both take well under a second, so a
/// counter still off after this is not late but wrong.
const SETTLE: Duration = Duration::from_secs(6);
const POLL: Duration = Duration::from_millis(20);

/// Where the books are in this kernel, found once per boot.
struct Locator {
    kcore: File,
    /// PT_LOAD segments of /proc/kcore: (vaddr, file offset, size).
    segments: Segments,
    current: Option<u64>,
    /// `pack_list` and the byte offsets of `ptr` and `bitmap` in `struct
    /// bpf_prog_pack` (from the kernel's BTF: a stable backport added a
    /// field before `bitmap` in 6.12.y), with the chunks per pack.
    packs: Option<(u64, u64, u64, u32)>,
    /// `bpf_kallsyms` and the layout that reads a trampoline image off it:
    /// offsets of `start`, `end`, `name`, `lnode` in `struct bpf_ksym`, of
    /// `ksym` in `struct bpf_tramp_image`, and of its `size` (6.2 on).
    images: Option<Result<ImageLayout, BooksError>>,
    /// Whether vmlinux BTF has `arch_alloc_bpf_trampoline()`: trampoline
    /// images come out of `bpf_prog_pack` with their exact size (x86 since
    /// 6.7); before, each is a page of its own.
    trampolines_in_packs: bool,
}

/// Why the JIT's books cannot be read on this kernel, or a reading failed.
/// Its text reaches the host as the `JitBooks` message's `unreadable`.
/// Clone: the locator's verdict is kept for the process and handed out.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BooksError {
    #[error("/proc/kcore: {0} (a kernel without CONFIG_PROC_KCORE)")]
    Kcore(Arc<std::io::Error>),
    #[error("/proc/kcore is not ELF64: {0}")]
    KcoreNotElf(object::Error),
    /// `/proc/kallsyms` could not be read (the reader's whole chain).
    #[error("reading /proc/kallsyms: {0}")]
    Kallsyms(String),
    #[error("/proc/kallsyms names {0} more than once")]
    NamedTwice(String),
    #[error(
        "/proc/kallsyms has no {CURRENT} (a kernel without CONFIG_KALLSYMS_ALL, \
         or addresses hidden by kptr_restrict)"
    )]
    NoCurrent,
    #[error("{BTF_VMLINUX}: {0} (a kernel without CONFIG_DEBUG_INFO_BTF)")]
    NoBtf(Arc<std::io::Error>),
    #[error("vmlinux BTF: {0}")]
    Btf(#[from] crate::btf::BtfError),
    #[error("vmlinux BTF has no struct {0} member {1}")]
    NoMember(&'static str, &'static str),
    #[error("{0:#x} is in no segment of /proc/kcore")]
    NotInKcore(u64),
    #[error("reading {len} bytes at {addr:#x} from /proc/kcore: {source}")]
    ReadKcore {
        len: usize,
        addr: u64,
        source: Arc<std::io::Error>,
    },
    #[error("pack_list has more than {MAX_PACKS} packs")]
    TooManyPacks,
    #[error("bpf_kallsyms has more than {MAX_KSYMS} symbols")]
    TooManyKsyms,
    #[error("this kernel's BTF has no struct bpf_ksym")]
    NoKsym,
    #[error("this kernel has no bpf_prog_pack (pack_list, 5.18 on)")]
    NoPacks,
    #[error(
        "trampoline images are pages of their own here: vmlinux BTF has no \
         arch_alloc_bpf_trampoline(), which carves them out of bpf_prog_pack (x86, 6.7 on)"
    )]
    TrampolinesOwnPages,
    #[error("struct bpf_tramp_image has no size (before 6.2)")]
    NoImageSize,
}

impl BooksError {
    /// Whether the error says this kernel lacks what the books are read
    /// through (a config option, a structure of a later release), as
    /// opposed to a reading that failed where it should have worked. The
    /// host makes the first a SKIPPED rule, the second an INFRA one.
    pub fn not_in_kernel(&self) -> bool {
        match self {
            BooksError::Kcore(e) | BooksError::NoBtf(e) => e.kind() == std::io::ErrorKind::NotFound,
            BooksError::NoCurrent
            | BooksError::NoMember(..)
            | BooksError::NoKsym
            | BooksError::NoPacks
            | BooksError::TrampolinesOwnPages
            | BooksError::NoImageSize => true,
            BooksError::KcoreNotElf(_)
            | BooksError::Kallsyms(_)
            | BooksError::NamedTwice(_)
            | BooksError::Btf(_)
            | BooksError::NotInKcore(_)
            | BooksError::ReadKcore { .. }
            | BooksError::TooManyPacks
            | BooksError::TooManyKsyms => false,
        }
    }
}

#[derive(Clone, Copy)]
struct ImageLayout {
    list: u64,
    start: u64,
    end: u64,
    name: u64,
    lnode: u64,
    ksym_in_image: u64,
    size_in_image: Option<u64>,
}

static LOCATOR: OnceLock<Result<Locator, BooksError>> = OnceLock::new();

/// Finds the books now (before a save, so that restored copies need not).
pub fn locate() {
    let _ = locator();
}

fn locator() -> &'static Result<Locator, BooksError> {
    LOCATOR.get_or_init(find)
}

/// PT_LOAD segments of /proc/kcore: (vaddr, file offset, size).
type Segments = Vec<(u64, u64, u64)>;

/// /proc/kcore and its segments.
fn open_kcore() -> Result<(File, Segments), BooksError> {
    let kcore = File::open("/proc/kcore").map_err(|e| BooksError::Kcore(Arc::new(e)))?;
    let segments = {
        let cache = ReadCache::new(&kcore);
        let elf = ElfFile64::<Endianness, _>::parse(&cache).map_err(BooksError::KcoreNotElf)?;
        elf.segments()
            .filter_map(|s| {
                let (offset, size) = s.file_range();
                (size > 0).then(|| (s.address(), offset, size))
            })
            .collect::<Vec<_>>()
    };
    Ok((kcore, segments))
}

/// `len` bytes of kernel memory at `addr`, through /proc/kcore (kernel
/// text: what instruction a kprobe would sit on).
pub fn kernel_bytes(addr: u64, len: usize) -> Result<Vec<u8>, BooksError> {
    let (kcore, segments) = open_kcore()?;
    read_segment(&kcore, &segments, addr, len)
}

/// `len` bytes at `addr` from the segment of `kcore` that holds them.
fn read_segment(
    kcore: &File,
    segments: &Segments,
    addr: u64,
    len: usize,
) -> Result<Vec<u8>, BooksError> {
    let (vaddr, offset, _) = segments
        .iter()
        .find(|(v, _, size)| addr >= *v && addr + len as u64 <= v + size)
        .ok_or(BooksError::NotInKcore(addr))?;
    let mut buf = vec![0u8; len];
    kcore
        .read_exact_at(&mut buf, offset + (addr - vaddr))
        .map_err(|e| BooksError::ReadKcore {
            len,
            addr,
            source: Arc::new(e),
        })?;
    Ok(buf)
}

fn find() -> Result<Locator, BooksError> {
    let (kcore, segments) = open_kcore()?;
    let found = crate::kallsyms::core_by_name(&CORE_NAMES)
        .map_err(|e| BooksError::Kallsyms(format!("{e:#}")))?;
    let one = |name: &str| -> Result<Option<u64>, BooksError> {
        let mut at = found.iter().filter(|e| e.name == name).map(|e| e.addr);
        match (at.next(), at.next()) {
            (None, _) => Ok(None),
            (Some(a), None) => Ok(Some(a)),
            (Some(_), Some(_)) => Err(BooksError::NamedTwice(name.to_owned())),
        }
    };
    let current = one(CURRENT)?;
    if current.is_none() {
        return Err(BooksError::NoCurrent);
    }
    let pack_list = one(PACK_LIST)?;
    let kallsyms_list = one(KALLSYMS_LIST)?;
    // vmlinux BTF (megabytes under TCG), read once for both layouts.
    let btf = (pack_list.is_some() || kallsyms_list.is_some())
        .then(|| std::fs::read(BTF_VMLINUX).map_err(|e| BooksError::NoBtf(Arc::new(e))));
    let btf = || -> Result<&Vec<u8>, BooksError> {
        btf.as_ref()
            .expect("read when a list was found")
            .as_ref()
            .map_err(Clone::clone)
    };
    let member = |s: &'static str, m: &'static str| -> Result<u64, BooksError> {
        crate::btf::member_offset(btf()?, s, m)?
            .map(u64::from)
            .ok_or(BooksError::NoMember(s, m))
    };
    let packs = match pack_list {
        None => None,
        Some(list) => {
            let (ptr, bitmap) = (
                member("bpf_prog_pack", "ptr")?,
                member("bpf_prog_pack", "bitmap")?,
            );
            let nodes = possible_nodes();
            let chunks = (PACK_SIZE_PER_NODE * nodes / CHUNK_SIZE) as u32;
            Some((list, ptr, bitmap, chunks))
        }
    };
    // Without the layout the images are not read, and the run says why
    // (rule jit-images not checked); the other books stand.
    let images = kallsyms_list.map(|list| {
        Ok(ImageLayout {
            list,
            start: member("bpf_ksym", "start")?,
            end: member("bpf_ksym", "end")?,
            name: member("bpf_ksym", "name")?,
            lnode: member("bpf_ksym", "lnode")?,
            ksym_in_image: member("bpf_tramp_image", "ksym")?,
            // Before 6.2 an image is a page and has no size field.
            size_in_image: member("bpf_tramp_image", "size").ok(),
        })
    });
    let trampolines_in_packs =
        packs.is_some() && crate::btf::func_id(btf()?, "arch_alloc_bpf_trampoline")?.is_some();
    Ok(Locator {
        kcore,
        segments,
        current,
        packs,
        images,
        trampolines_in_packs,
    })
}

/// `num_possible_nodes()`: the count of /sys/devices/system/node/possible
/// (a list such as `0` or `0-3`), 1 on a kernel without NUMA.
fn possible_nodes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/sys/devices/system/node/possible") else {
        return 1;
    };
    text.trim()
        .split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<u64>().ok()? - a.parse::<u64>().ok()? + 1),
            None => r.parse::<u64>().ok().map(|_| 1),
        })
        .sum::<u64>()
        .max(1)
}

impl Locator {
    fn read_bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, BooksError> {
        read_segment(&self.kcore, &self.segments, addr, len)
    }

    fn u64_at(&self, addr: u64) -> Result<u64, BooksError> {
        let b = self.read_bytes(addr, 8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn read(&self) -> Result<JitReading, BooksError> {
        let current = match self.current {
            Some(at) => Some(self.u64_at(at)? as i64),
            None => None,
        };
        let packs = match self.packs {
            None => None,
            Some((list, ptr_off, bitmap_off, chunks)) => {
                let mut packs = Vec::new();
                // list_head.next is the first member of list_head, and
                // `list` is the first member of bpf_prog_pack: a node's
                // address is its pack's.
                let mut node = self.u64_at(list)?;
                while node != list {
                    if packs.len() == MAX_PACKS {
                        return Err(BooksError::TooManyPacks);
                    }
                    let base = self.u64_at(node + ptr_off)?;
                    let words = (chunks as usize).div_ceil(64);
                    let bits = self.read_bytes(node + bitmap_off, words * 8)?;
                    packs.push(PackReading {
                        base,
                        chunk_size: CHUNK_SIZE as u32,
                        chunks,
                        used: runs(&bits, chunks),
                    });
                    node = self.u64_at(node)?;
                }
                Some(packs)
            }
        };
        Ok(JitReading { current, packs })
    }
}

impl Locator {
    fn layout(&self) -> Result<ImageLayout, BooksError> {
        match &self.images {
            None => Err(BooksError::NoKsym),
            Some(Err(e)) => Err(e.clone()),
            Some(Ok(l)) => Ok(*l),
        }
    }

    /// Calls `each(ksym address, name)` for every symbol on `bpf_kallsyms`.
    fn walk(
        &self,
        l: &ImageLayout,
        mut each: impl FnMut(u64, &[u8]) -> Result<(), BooksError>,
    ) -> Result<(), BooksError> {
        let mut node = self.u64_at(l.list)?;
        let mut walked = 0;
        while node != l.list {
            walked += 1;
            if walked > MAX_KSYMS {
                return Err(BooksError::TooManyKsyms);
            }
            let ksym = node - l.lnode;
            let name = self.read_bytes(ksym + l.name, 64)?;
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            each(ksym, &name[..len])?;
            node = self.u64_at(node)?;
        }
        Ok(())
    }

    /// The trampoline images on `bpf_kallsyms` now.
    fn images(&self) -> Result<Vec<ImageReading>, BooksError> {
        let l = match &self.images {
            None => return Ok(Vec::new()),
            Some(_) => self.layout()?,
        };
        let mut out = Vec::new();
        self.walk(&l, |ksym, name| {
            if !name.starts_with(TRAMPOLINE_PREFIX) {
                return Ok(());
            }
            let image = ksym - l.ksym_in_image;
            let size = match l.size_in_image {
                Some(off) => {
                    let b = self.read_bytes(image + off, 4)?;
                    Some(u32::from_le_bytes(b.try_into().expect("4 bytes")))
                }
                None => None,
            };
            out.push(ImageReading {
                name: String::from_utf8_lossy(name).into_owned(),
                start: self.u64_at(ksym + l.start)?,
                end: self.u64_at(ksym + l.end)?,
                size,
                seen_at: Vec::new(),
            });
            Ok(())
        })?;
        Ok(out)
    }

    /// Every symbol on `bpf_kallsyms` now.
    fn ksyms(&self) -> Result<Vec<KsymReading>, BooksError> {
        let l = self.layout()?;
        let mut out = Vec::new();
        self.walk(&l, |ksym, name| {
            out.push(KsymReading {
                name: String::from_utf8_lossy(name).into_owned(),
                start: self.u64_at(ksym + l.start)?,
                end: self.u64_at(ksym + l.end)?,
            });
            Ok(())
        })?;
        Ok(out)
    }
}

/// What the `pack-boundary` step reads: the books of this kernel, or why
/// they cannot be read.
pub struct Books(&'static Locator);

impl Books {
    pub fn get() -> Result<Books, BooksError> {
        let loc = locator().as_ref().map_err(Clone::clone)?;
        if loc.packs.is_none() {
            return Err(BooksError::NoPacks);
        }
        if !loc.trampolines_in_packs {
            return Err(BooksError::TrampolinesOwnPages);
        }
        match &loc.images {
            Some(Ok(l)) if l.size_in_image.is_some() => Ok(Books(loc)),
            Some(Ok(_)) => Err(BooksError::NoImageSize),
            Some(Err(e)) => Err(e.clone()),
            None => Err(BooksError::NoKsym),
        }
    }

    /// The trampoline images live now, with `im->size`.
    pub fn images(&self) -> Result<Vec<ImageReading>, BooksError> {
        self.0.images()
    }

    /// Every `bpf_prog_pack` now.
    pub fn packs(&self) -> Result<Vec<PackReading>, BooksError> {
        Ok(self.0.read()?.packs.unwrap_or_default())
    }

    /// Every symbol on `bpf_kallsyms` now.
    pub fn ksyms(&self) -> Result<Vec<KsymReading>, BooksError> {
        self.0.ksyms()
    }

    /// The symbols, the packs, the symbols again (see [`BooksMoment`]).
    pub fn moment(&self, what: &str) -> Result<BooksMoment, BooksError> {
        let before = self.ksyms()?;
        let packs = self.packs()?;
        let after = self.ksyms()?;
        Ok(BooksMoment {
            what: what.to_owned(),
            before,
            packs,
            after,
        })
    }
}

/// Runs of set bits (first, length) in a little-endian bitmap of `n` bits.
fn runs(bitmap: &[u8], n: u32) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for i in 0..n {
        if bitmap[(i / 8) as usize] & (1 << (i % 8)) == 0 {
            continue;
        }
        match out.last_mut() {
            Some((first, len)) if *first + *len == i => *len += 1,
            _ => out.push((i, 1)),
        }
    }
    out
}

/// Trampoline images seen so far in this boot's plan (by start address
/// and name), and the first error reading them. Process-wide, because a
/// trampoline can live inside one step only: a fail-nth sweep's successful
/// attach is closed again before the step ends, so its image is read while
/// its link is open ([`sight_images`]), not after the step.
static SIGHTED: std::sync::Mutex<(Vec<ImageReading>, Option<BooksError>)> =
    std::sync::Mutex::new((Vec::new(), None));

/// Notes the trampoline images live now, with where the rings are
/// (`heads`: listener index, `data_head`).
pub fn sight_images(heads: &[(u32, u64)]) {
    let Ok(loc) = locator() else {
        return;
    };
    let read = loc.images();
    let mut sighted = SIGHTED.lock().unwrap_or_else(|e| e.into_inner());
    match read {
        Ok(now) => {
            // An address is reused by a later image of the same
            // trampoline (another size): each (start, name, size) is kept
            // once, with when it was first seen.
            for mut i in now {
                if !sighted
                    .0
                    .iter()
                    .any(|s| s.start == i.start && s.name == i.name && s.size == i.size)
                {
                    i.seen_at = heads.to_vec();
                    sighted.0.push(i);
                }
            }
        }
        Err(e) => {
            sighted.1.get_or_insert(e);
        }
    }
}

/// The books as they were before the first step.
pub struct Watch {
    start: Result<JitReading, BooksError>,
}

impl Watch {
    pub fn start() -> Watch {
        *SIGHTED.lock().unwrap_or_else(|e| e.into_inner()) = (Vec::new(), None);
        Watch {
            start: locator()
                .as_ref()
                .map_err(Clone::clone)
                .and_then(Locator::read),
        }
    }

    /// Waits (at most [`SETTLE`]) for the counter to come back to its
    /// start value, then reads the books again with the `[bpf]` symbols
    /// still in /proc/kallsyms. Call with everything the plan made closed.
    /// Also returns that read of /proc/kallsyms (every module part's
    /// lines), for the executable-area books' end reading.
    pub fn finish(self) -> (Message, Option<Vec<kloop_protocol::KallsymsEntry>>) {
        let settle_started = Instant::now();
        let (start, end, unreadable) = match (locator(), self.start) {
            (Ok(loc), Ok(start)) => {
                let mut end = loc.read();
                while let Ok(e) = &end {
                    // Code from before the plan freed during it lowers the
                    // counter by its chunks (JitReading::chunk_bytes_freed_since).
                    let want = start.current.map(|c| c - e.chunk_bytes_freed_since(&start));
                    if e.current == want || settle_started.elapsed() >= SETTLE {
                        break;
                    }
                    std::thread::sleep(POLL);
                    end = loc.read();
                }
                match end {
                    Ok(end) => (start, end, None),
                    Err(e) => (start, JitReading::default(), Some(e)),
                }
            }
            (Err(e), _) => (
                JitReading::default(),
                JitReading::default(),
                Some(e.clone()),
            ),
            (_, Err(e)) => (JitReading::default(), JitReading::default(), Some(e)),
        };
        let settle_ns = settle_started.elapsed().as_nanos() as u64;
        let symbols = if unreadable.is_none() {
            crate::kallsyms::read_filtered(|e| e.module.is_some()).ok()
        } else {
            None
        };
        let live = symbols
            .iter()
            .flatten()
            .filter(|e| e.module.as_deref() == Some("bpf"))
            .map(|e| e.addr)
            .collect();
        let (images, images_error) =
            std::mem::take(&mut *SIGHTED.lock().unwrap_or_else(|e| e.into_inner()));
        let message = Message::JitBooks {
            start,
            end,
            settle_ns,
            live,
            unreadable_in_kernel: unreadable.as_ref().is_some_and(BooksError::not_in_kernel),
            unreadable: unreadable.map(|e| e.to_string()),
            images,
            images_unreadable_in_kernel: images_error
                .as_ref()
                .is_some_and(BooksError::not_in_kernel),
            images_unreadable: images_error.map(|e| e.to_string()),
        };
        (message, symbols)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_used_chunks() {
        // bits 0,1,2 and 9, 15 set; bit 16 is past n = 16.
        assert_eq!(
            runs(&[0b0000_0111, 0b1000_0010, 0xff], 16),
            vec![(0, 3), (9, 1), (15, 1)]
        );
        assert_eq!(runs(&[0, 0], 16), vec![]);
    }

    /// The texts the host sees name the constants, as they did as strings.
    #[test]
    fn messages_name_the_constants() {
        assert_eq!(
            BooksError::NoCurrent.to_string(),
            "/proc/kallsyms has no bpf_jit_current (a kernel without CONFIG_KALLSYMS_ALL, \
             or addresses hidden by kptr_restrict)"
        );
        assert_eq!(
            BooksError::TooManyPacks.to_string(),
            "pack_list has more than 64 packs"
        );
        assert_eq!(
            BooksError::NotInKcore(0x1000).to_string(),
            "0x1000 is in no segment of /proc/kcore"
        );
    }
}
