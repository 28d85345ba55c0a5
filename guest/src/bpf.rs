//! The few raw `bpf(2)` commands the agent issues itself.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use anyhow::{bail, Result};
use kloop_protocol::{KallsymsEntry, ProgFacts};

use crate::sys::OsContext;

const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `struct bpf_prog_info` as of Linux 6.1 (include/uapi/linux/bpf.h). Older
/// kernels accept the larger size as long as the tail they do not know is zero.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct BpfProgInfo {
    pub prog_type: u32,
    pub id: u32,
    pub tag: [u8; 8],
    pub jited_prog_len: u32,
    pub xlated_prog_len: u32,
    pub jited_prog_insns: u64,
    pub xlated_prog_insns: u64,
    pub load_time: u64,
    pub created_by_uid: u32,
    pub nr_map_ids: u32,
    pub map_ids: u64,
    pub name: [u8; 16],
    pub ifindex: u32,
    pub gpl_compatible: u32,
    pub netns_dev: u64,
    pub netns_ino: u64,
    pub nr_jited_ksyms: u32,
    pub nr_jited_func_lens: u32,
    pub jited_ksyms: u64,
    pub jited_func_lens: u64,
    pub btf_id: u32,
    pub func_info_rec_size: u32,
    pub func_info: u64,
    pub nr_func_info: u32,
    pub nr_line_info: u32,
    pub line_info: u64,
    pub jited_line_info: u64,
    pub nr_jited_line_info: u32,
    pub line_info_rec_size: u32,
    pub jited_line_info_rec_size: u32,
    pub nr_prog_tags: u32,
    pub prog_tags: u64,
    pub run_time_ns: u64,
    pub run_cnt: u64,
    pub recursion_misses: u64,
    pub verified_insns: u32,
    pub attach_btf_obj_id: u32,
    pub attach_btf_id: u32,
    pub pad: u32,
}

const _: () = assert!(std::mem::size_of::<BpfProgInfo>() == 232);

#[repr(C, align(8))]
struct InfoByFdAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

#[repr(C, align(8))]
struct GetNextIdAttr {
    start_id: u32,
    next_id: u32,
    open_flags: u32,
    pad: u32,
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: attr points to a properly laid out, fully initialised bpf_attr prefix.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn info_by_fd(fd: BorrowedFd<'_>, info: &mut BpfProgInfo) -> io::Result<()> {
    let mut attr = InfoByFdAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<BpfProgInfo>() as u32,
        info: info as *mut BpfProgInfo as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
}

/// What the agent reports about a loaded program.
pub struct ProgInfo {
    pub info: BpfProgInfo,
    pub jited_ksyms: Vec<u64>,
    pub jited_func_lens: Vec<u32>,
    pub func_tags: Vec<[u8; 8]>,
}

impl ProgInfo {
    pub fn name(&self) -> String {
        let end = self.info.name.iter().position(|&b| b == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.info.name[..end]).into_owned()
    }

    /// The facts sent to the host, with the `/proc/kallsyms` lines at the
    /// program's JITed addresses (picked from `kallsyms`).
    pub fn facts(&self, label: String, kallsyms: &[KallsymsEntry]) -> ProgFacts {
        ProgFacts {
            label,
            id: self.info.id,
            tag: self.info.tag,
            name: self.name(),
            prog_type: self.info.prog_type,
            jited_ksyms: self.jited_ksyms.clone(),
            jited_func_lens: self.jited_func_lens.clone(),
            func_tags: self.func_tags.clone(),
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
    let mut info = BpfProgInfo::default();
    info_by_fd(fd, &mut info).os_ctx("BPF_OBJ_GET_INFO_BY_FD (counts)")?;
    let mut jited_ksyms = vec![0u64; info.nr_jited_ksyms as usize];
    let mut jited_func_lens = vec![0u32; info.nr_jited_func_lens as usize];
    let mut func_tags = vec![[0u8; 8]; info.nr_prog_tags as usize];
    if !jited_ksyms.is_empty() || !jited_func_lens.is_empty() || !func_tags.is_empty() {
        let mut second = BpfProgInfo {
            nr_jited_ksyms: jited_ksyms.len() as u32,
            jited_ksyms: jited_ksyms.as_mut_ptr() as u64,
            nr_jited_func_lens: jited_func_lens.len() as u32,
            jited_func_lens: jited_func_lens.as_mut_ptr() as u64,
            nr_prog_tags: func_tags.len() as u32,
            prog_tags: func_tags.as_mut_ptr() as u64,
            ..Default::default()
        };
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
    Ok(ProgInfo {
        info,
        jited_ksyms,
        jited_func_lens,
        func_tags,
    })
}

/// Every program id currently visible (`BPF_PROG_GET_NEXT_ID` walk).
pub fn prog_ids() -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    let mut start = 0u32;
    loop {
        let mut attr = GetNextIdAttr {
            start_id: start,
            next_id: 0,
            open_flags: 0,
            pad: 0,
        };
        match sys_bpf(BPF_PROG_GET_NEXT_ID, &mut attr) {
            Ok(_) => {
                ids.push(attr.next_id);
                start = attr.next_id;
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
    let mut attr = GetNextIdAttr {
        start_id: id, // the union's `prog_id` shares the first word
        next_id: 0,
        open_flags: 0,
        pad: 0,
    };
    sys_bpf_fd(BPF_PROG_GET_FD_BY_ID, &mut attr)
}

/// A `bpf()` command that returns a new fd (`attr` is a properly laid out,
/// fully initialised `bpf_attr` prefix, as for [`sys_bpf`]).
pub(crate) fn sys_bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = sys_bpf(cmd, attr)?;
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
