//! The few raw `bpf(2)` commands the agent issues itself.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use anyhow::{bail, Result};
use kloop_protocol::{KallsymsEntry, ProgFacts};

use crate::sys::OsContext;

/// `union bpf_attr` and `struct bpf_prog_info` as aya's bindings generate
/// them from `include/uapi/linux/bpf.h`.
pub use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};

// `bpf_prog_info` as of the bindings' kernel (the same 232 bytes as 6.1's);
// the agent hands the kernel its whole size. Older kernels accept the
// larger size as long as the tail they do not know is zero, and the agent
// reads only fields 5.1 already has.
const _: () = assert!(std::mem::size_of::<bpf_prog_info>() == 232);

/// How many bytes of `bpf_attr` a command passes: the end of the last field
/// it fills, rounded up to the union's 8-byte alignment, as a prefix struct
/// of those fields would be. Passing only the prefix keeps the call valid on
/// kernels older than the bindings (the kernel zero-fills the rest); passing
/// the whole union would too, but the prefix is what the agent always sent.
pub const fn attr_size(end_of_last_field: usize) -> u32 {
    end_of_last_field.next_multiple_of(8) as u32
}

/// `BPF_OBJ_GET_INFO_BY_FD`: `info.bpf_fd`, `info.info_len`, `info.info`.
const INFO_BY_FD_SIZE: u32 = attr_size(std::mem::offset_of!(bpf_attr, info.info) + 8);
/// `BPF_PROG_GET_NEXT_ID` and `BPF_PROG_GET_FD_BY_ID`: the id (`start_id`
/// or `prog_id`), `next_id`, `open_flags`.
const GET_ID_SIZE: u32 = attr_size(std::mem::offset_of!(bpf_attr, __bindgen_anon_6.open_flags) + 4);
/// `BPF_RAW_TRACEPOINT_OPEN`: `name` and `prog_fd` (the `cookie` after
/// them is 6.10+).
pub const RAW_TRACEPOINT_OPEN_SIZE: u32 =
    attr_size(std::mem::offset_of!(bpf_attr, raw_tracepoint.prog_fd) + 4);
const _: () = assert!(INFO_BY_FD_SIZE == 16 && GET_ID_SIZE == 16);
/// The license of every program loaded by hand (tracing and struct_ops
/// programs must be GPL-compatible).
static GPL: &[u8; 4] = b"GPL\0";

/// A `BPF_PROG_LOAD` attribute for `insns` of `prog_type` under the GPL,
/// named `name` (its first 15 bytes; empty: no name). The attribute points
/// into `insns`, which must outlive the syscall.
pub fn prog_load_attr(
    prog_type: aya_obj::generated::bpf_prog_type,
    insns: &[u64],
    name: &str,
) -> bpf_attr {
    let mut attr = zeroed_attr();
    // The prog-load member of the union (bindgen's name for the anonymous
    // struct `BPF_PROG_LOAD` uses).
    attr.__bindgen_anon_3.prog_type = prog_type as u32;
    attr.__bindgen_anon_3.insn_cnt = insns.len() as u32;
    attr.__bindgen_anon_3.insns = insns.as_ptr() as u64;
    attr.__bindgen_anon_3.license = GPL.as_ptr() as u64;
    let mut prog_name = [0 as libc::c_char; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s as libc::c_char;
    }
    attr.__bindgen_anon_3.prog_name = prog_name;
    attr
}

/// `BPF_PROG_LOAD` up to `attach_prog_fd` (5.5+), the last field a program
/// loaded by hand (the probes, the ksymbol watch, struct_ops) needs zero
/// in: it attaches to a kernel function or type, not to a program.
pub const PROG_LOAD_SIZE: u32 =
    attr_size(std::mem::offset_of!(bpf_attr, __bindgen_anon_3.__bindgen_anon_1) + 4);
const _: () = assert!(PROG_LOAD_SIZE == 120 && RAW_TRACEPOINT_OPEN_SIZE == 16);

/// A zeroed `bpf_attr`: every field a command does not set must be zero.
pub fn zeroed_attr() -> bpf_attr {
    // SAFETY: bpf_attr is a union of plain integer structs; all zeroes is
    // a valid value of each.
    unsafe { std::mem::zeroed() }
}

/// `bpf(cmd, attr, size)`; `size` is the prefix of `attr` the command reads
/// (see [`attr_size`]).
pub(crate) fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr, size: u32) -> io::Result<libc::c_long> {
    debug_assert!(size as usize <= std::mem::size_of::<bpf_attr>());
    // SAFETY: attr is a fully initialised bpf_attr at least `size` bytes long.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            size as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn info_by_fd(fd: BorrowedFd<'_>, info: &mut bpf_prog_info) -> io::Result<()> {
    let mut attr = zeroed_attr();
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = std::mem::size_of::<bpf_prog_info>() as u32;
    attr.info.info = info as *mut bpf_prog_info as u64;
    sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr, INFO_BY_FD_SIZE).map(|_| ())
}

fn zeroed_prog_info() -> bpf_prog_info {
    // SAFETY: bpf_prog_info is plain integers; all zeroes is valid.
    unsafe { std::mem::zeroed() }
}

/// What the agent reports about a loaded program.
pub struct ProgInfo {
    pub info: bpf_prog_info,
    pub jited_ksyms: Vec<u64>,
    pub jited_func_lens: Vec<u32>,
    pub func_tags: Vec<[u8; 8]>,
    /// The BTF FUNC name of each function, in func_info order (the order
    /// of jited_ksyms); empty without func_info.
    pub func_names: Vec<String>,
}

impl ProgInfo {
    pub fn name(&self) -> String {
        // `c_char` is i8 on x86-64: the bytes as the kernel wrote them.
        let bytes: Vec<u8> = self.info.name.iter().map(|&c| c as u8).collect();
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(16);
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// The facts sent to the host, with the `/proc/kallsyms` lines at the
    /// program's JITed addresses (picked from `kallsyms`).
    pub fn facts(&self, label: String, kallsyms: &[KallsymsEntry]) -> ProgFacts {
        ProgFacts {
            label,
            id: self.info.id,
            tag: self.info.tag,
            name: self.name(),
            prog_type: self.info.type_,
            jited_ksyms: self.jited_ksyms.clone(),
            jited_func_lens: self.jited_func_lens.clone(),
            func_tags: self.func_tags.clone(),
            func_names: self.func_names.clone(),
            kallsyms: kallsyms
                .iter()
                .filter(|e| self.jited_ksyms.contains(&e.addr))
                .cloned()
                .collect(),
        }
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` in two passes: counts first, then the arrays.
pub fn prog_info(fd: BorrowedFd<'_>) -> Result<ProgInfo> {
    let mut info = zeroed_prog_info();
    info_by_fd(fd, &mut info).os_ctx("BPF_OBJ_GET_INFO_BY_FD (counts)")?;
    let mut jited_ksyms = vec![0u64; info.nr_jited_ksyms as usize];
    let mut jited_func_lens = vec![0u32; info.nr_jited_func_lens as usize];
    let mut func_tags = vec![[0u8; 8]; info.nr_prog_tags as usize];
    if !jited_ksyms.is_empty() || !jited_func_lens.is_empty() || !func_tags.is_empty() {
        // Field by field into a zeroed struct: a struct literal with
        // `..zeroed()` may leave its padding uninitialised, and a kernel
        // whose bpf_prog_info is shorter (5.10) refuses a tail that is not
        // all zeroes with E2BIG (bpf_check_uarg_tail_zero).
        let mut second = zeroed_prog_info();
        second.nr_jited_ksyms = jited_ksyms.len() as u32;
        second.jited_ksyms = jited_ksyms.as_mut_ptr() as u64;
        second.nr_jited_func_lens = jited_func_lens.len() as u32;
        second.jited_func_lens = jited_func_lens.as_mut_ptr() as u64;
        second.nr_prog_tags = func_tags.len() as u32;
        second.prog_tags = func_tags.as_mut_ptr() as u64;
        info_by_fd(fd, &mut second).os_ctx("BPF_OBJ_GET_INFO_BY_FD (jited_ksyms)")?;
        if second.id != info.id {
            bail!(
                "BPF_OBJ_GET_INFO_BY_FD returned id {} then {}",
                info.id,
                second.id
            );
        }
        // The kernel writes back how many it had; it never writes more than asked.
        jited_ksyms.truncate(second.nr_jited_ksyms as usize);
        jited_func_lens.truncate(second.nr_jited_func_lens as usize);
        func_tags.truncate(second.nr_prog_tags as usize);
        if second.jited_ksyms == 0 {
            // Kernel refused raw addresses (bpf_dump_raw_ok: kptr_restrict).
            jited_ksyms.iter_mut().for_each(|a| *a = 0);
        }
    }
    let func_names = func_names(fd, &info)?;
    Ok(ProgInfo {
        info,
        jited_ksyms,
        jited_func_lens,
        func_tags,
        func_names,
    })
}

/// `sizeof(struct bpf_func_info)`: `insn_off`, `type_id`.
const FUNC_INFO_REC_SIZE: u32 = 8;

/// The BTF FUNC name of each of the program's functions: its func_info
/// records (one per function, in the order of its subprograms) name FUNC
/// types of the program's BTF, which the kernel hands out by `btf_id`. The
/// kernel names a function's symbol after exactly this name
/// (bpf_prog_ksym_set_name()), so the host can hold the symbol to it.
fn func_names(fd: BorrowedFd<'_>, info: &bpf_prog_info) -> Result<Vec<String>> {
    if info.nr_func_info == 0 || info.btf_id == 0 {
        return Ok(Vec::new());
    }
    let mut records = vec![[0u32; 2]; info.nr_func_info as usize];
    let mut second = zeroed_prog_info();
    second.nr_func_info = records.len() as u32;
    second.func_info_rec_size = FUNC_INFO_REC_SIZE;
    second.func_info = records.as_mut_ptr() as u64;
    info_by_fd(fd, &mut second).os_ctx("BPF_OBJ_GET_INFO_BY_FD (func_info)")?;
    records.truncate(second.nr_func_info as usize);
    let btf = btf_by_id(info.btf_id)?;
    records
        .iter()
        .map(|[_, type_id]| {
            crate::btf::type_name(&btf, *type_id)
                .map_err(|e| anyhow::anyhow!("BTF {} of program {}: {e}", info.btf_id, info.id))
        })
        .collect()
}

/// The raw BTF the kernel holds as object `id` (`BPF_BTF_GET_FD_BY_ID`,
/// then `BPF_OBJ_GET_INFO_BY_FD` for its size and then its bytes).
fn btf_by_id(id: u32) -> Result<Vec<u8>> {
    use aya_obj::generated::bpf_btf_info;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_6.__bindgen_anon_1.btf_id = id;
    let btf = sys_bpf_fd(bpf_cmd::BPF_BTF_GET_FD_BY_ID, &mut attr, GET_ID_SIZE)
        .os_ctx(format!("BPF_BTF_GET_FD_BY_ID {id}"))?;
    let get = |info: &mut bpf_btf_info| {
        let mut attr = zeroed_attr();
        attr.info.bpf_fd = btf.as_raw_fd() as u32;
        attr.info.info_len = std::mem::size_of::<bpf_btf_info>() as u32;
        attr.info.info = info as *mut bpf_btf_info as u64;
        sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr, INFO_BY_FD_SIZE).map(|_| ())
    };
    // SAFETY: bpf_btf_info is plain integers; all zeroes is valid.
    let mut info: bpf_btf_info = unsafe { std::mem::zeroed() };
    get(&mut info).os_ctx(format!("BPF_OBJ_GET_INFO_BY_FD of BTF {id} (size)"))?;
    let mut bytes = vec![0u8; info.btf_size as usize];
    // SAFETY: as above.
    let mut second: bpf_btf_info = unsafe { std::mem::zeroed() };
    second.btf = bytes.as_mut_ptr() as u64;
    second.btf_size = bytes.len() as u32;
    get(&mut second).os_ctx(format!("BPF_OBJ_GET_INFO_BY_FD of BTF {id} (bytes)"))?;
    bytes.truncate(second.btf_size as usize);
    Ok(bytes)
}

/// Every program id currently visible (`BPF_PROG_GET_NEXT_ID` walk).
pub fn prog_ids() -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    let mut start = 0u32;
    loop {
        let mut attr = zeroed_attr();
        attr.__bindgen_anon_6.__bindgen_anon_1.start_id = start;
        match sys_bpf(bpf_cmd::BPF_PROG_GET_NEXT_ID, &mut attr, GET_ID_SIZE) {
            Ok(_) => {
                // SAFETY: the kernel answered in the get-next-id member.
                let next = unsafe { attr.__bindgen_anon_6.next_id };
                ids.push(next);
                start = next;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(ids),
            Err(e) => return Err(e).os_ctx(format!("BPF_PROG_GET_NEXT_ID after {start}")),
        }
    }
}

/// `BPF_PROG_GET_FD_BY_ID`: a new reference to program `id`, as a
/// recorder takes one to read a program's info. `ENOENT` once the program
/// is gone (its id is freed before its memory).
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_6.__bindgen_anon_1.prog_id = id;
    sys_bpf_fd(bpf_cmd::BPF_PROG_GET_FD_BY_ID, &mut attr, GET_ID_SIZE)
}

/// A `bpf()` command that returns a new fd (`size` as for [`sys_bpf`]).
pub fn sys_bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr, size: u32) -> io::Result<OwnedFd> {
    let fd = sys_bpf(cmd, attr, size)?;
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
