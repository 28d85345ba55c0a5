//! `struct-ops`: a `tcp_congestion_ops` registered through a
//! `BPF_MAP_TYPE_STRUCT_OPS` map and unregistered again, with raw `bpf(2)`
//! (aya 0.14 loads no struct_ops program and creates no struct_ops map).
//!
//! What the kernel does (kernel/bpf/bpf_struct_ops.c, Debian 6.12):
//! `bpf_struct_ops_map_update_elem()` writes one trampoline per function
//! member into an image page (`bpf_struct_ops_prepare_trampoline()`, a new
//! page only when the next one does not fit), names each
//! `bpf__<type>_<member>` with its own extent (`bpf_struct_ops_ksym_init()`
//! → `bpf_image_ksym_init(image + off, size)`) and, once the type's `reg()`
//! took it, announces them with `bpf_image_ksym_add()` — whose
//! `PERF_RECORD_KSYMBOL` says `PAGE_SIZE` whatever the size (the fault of
//! ledger entry `trampoline-ksymbol-page-len-overlap`).
//! `bpf_struct_ops_map_delete_elem()` calls `unreg()` and drops the
//! registration's map reference; closing the map's last fd frees it from a
//! worker (`bpf_struct_ops_map_free()`: the symbols are deleted, RCU and
//! RCU-tasks grace periods pass, then the image is freed and the programs
//! put). Kernels before the names (5.10, 6.1) announce no trampoline at
//! all; the programs are ordinary JITed programs either way.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aya_obj::generated::{bpf_map_type, bpf_prog_type};
use kloop_protocol::{KallsymsEntry, Message};

use crate::bpf::PROG_LOAD_SIZE;
use crate::bpf::{self, attr_size, bpf_attr, bpf_cmd, sys_bpf, sys_bpf_fd, zeroed_attr};
use crate::btf::{self, StructLayout};
use crate::channel::send;
use crate::context::StepContext;
use crate::sys::{Errno, OsContext};

pub const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";
/// The struct_ops type and the map's value type
/// (`bpf_struct_ops_<type>`, emitted for every struct_ops type).
pub const OPS_TYPE: &str = "tcp_congestion_ops";
pub const VALUE_TYPE: &str = "bpf_struct_ops_tcp_congestion_ops";
/// What tcp_validate_congestion_control() asks of a congestion control:
/// `ssthresh`, `undo_cwnd`, and `cong_avoid` or `cong_control`.
const MEMBERS: [&str; 3] = ["ssthresh", "cong_avoid", "undo_cwnd"];
/// `bpf_struct_ops_ksym_init()`: `bpf__<type>_<member>`.
pub const SYMBOL_PREFIX: &str = "bpf__tcp_congestion_ops_";
const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// `BPF_MAP_CREATE` up to `btf_vmlinux_value_type_id` (5.6+).
const MAP_CREATE_SIZE: u32 =
    attr_size(std::mem::offset_of!(bpf_attr, __bindgen_anon_1.btf_vmlinux_value_type_id) + 4);
/// `BPF_MAP_UPDATE_ELEM` / `BPF_MAP_DELETE_ELEM`: `map_fd`, `key`,
/// `value`, `flags`.
const MAP_ELEM_SIZE: u32 = attr_size(std::mem::offset_of!(bpf_attr, __bindgen_anon_2.flags) + 8);
const _: () = assert!(MAP_CREATE_SIZE == 64 && MAP_ELEM_SIZE == 32);

/// The two structs of vmlinux BTF the step lays its value out from.
pub struct Types {
    pub ops: StructLayout,
    pub value: StructLayout,
    /// `data`'s offset in the value (after the common header, cacheline
    /// aligned).
    pub data: u32,
}

/// The layout from vmlinux BTF; `Ok(Err(reason))` when the kernel lacks
/// what it takes (the probe's words).
pub fn types() -> Result<std::result::Result<Types, String>> {
    let raw = match std::fs::read(BTF_VMLINUX) {
        Ok(raw) => raw,
        Err(e) => {
            return Ok(Err(format!(
                "{BTF_VMLINUX}: {}: struct_ops needs kernel BTF (CONFIG_DEBUG_INFO_BTF)",
                Errno(&e)
            )))
        }
    };
    let find = |name: &str| {
        btf::struct_layout(&raw, name).map_err(|e| anyhow!("parsing {BTF_VMLINUX}: {e}"))
    };
    let Some(value) = find(VALUE_TYPE)? else {
        return Ok(Err(format!(
            "{BTF_VMLINUX} has no STRUCT {VALUE_TYPE}: no tcp_congestion_ops struct_ops type \
             (net/ipv4/bpf_tcp_ca.c: CONFIG_INET, and CONFIG_BPF_JIT before 6.x)"
        )));
    };
    let Some(ops) = find(OPS_TYPE)? else {
        return Ok(Err(format!("{BTF_VMLINUX} has no STRUCT {OPS_TYPE}")));
    };
    let Some((_, data)) = value.member("data") else {
        return Ok(Err(format!(
            "{BTF_VMLINUX}: STRUCT {VALUE_TYPE} has no member data"
        )));
    };
    for m in MEMBERS.iter().chain(&["name"]) {
        if ops.member(m).is_none() {
            return Ok(Err(format!(
                "{BTF_VMLINUX}: STRUCT {OPS_TYPE} has no member {m}"
            )));
        }
    }
    Ok(Ok(Types { ops, value, data }))
}

/// Whether the kernel names struct_ops trampolines: `struct
/// bpf_struct_ops_map` has `ksyms` (the array of `bpf_ksym` that
/// bpf_struct_ops_ksym_init() fills), or the reason it does not.
pub fn names_trampolines() -> Result<std::result::Result<(), String>> {
    let raw = match std::fs::read(BTF_VMLINUX) {
        Ok(raw) => raw,
        Err(e) => {
            return Ok(Err(format!(
                "{BTF_VMLINUX}: {}: no kernel BTF (CONFIG_DEBUG_INFO_BTF)",
                Errno(&e)
            )))
        }
    };
    match btf::member_offset(&raw, "bpf_struct_ops_map", "ksyms") {
        Ok(Some(_)) => Ok(Ok(())),
        Ok(None) => Ok(Err(format!(
            "{BTF_VMLINUX}: struct bpf_struct_ops_map has no member ksyms: this kernel does not \
             name struct_ops trampolines (no bpf_struct_ops_ksym_init() in \
             kernel/bpf/bpf_struct_ops.c, so no bpf__<type>_<member> symbol and no KSYMBOL \
             record for them)"
        ))),
        Err(e) => bail!("parsing {BTF_VMLINUX}: {e}"),
    }
}

/// `r0 = ret; exit` as the struct_ops program of member `index` of
/// `tcp_congestion_ops` (BTF id `ops_id`), named `name`. Every member the
/// step fills returns u32 or void; the verifier skips the return check of
/// a void member (check_return_code()), and any u32 is in range for the
/// others. Each program returns its own `ret`, so their tags differ.
fn load_member(ops_id: u32, index: u32, name: &str, ret: u32) -> Result<OwnedFd> {
    let insns: [u64; 2] = [
        // BPF_ALU64 | BPF_MOV | BPF_K: r0 = ret (imm in the high 32 bits).
        0x0000_0000_0000_00b7 | (u64::from(ret) << 32),
        0x0000_0000_0000_0095, // BPF_JMP | BPF_EXIT
    ];
    // bpf_tcp_ca programs must be GPL-compatible (check_struct_ops_btf_id()),
    // as prog_load_attr() makes them.
    let mut attr = bpf::prog_load_attr(bpf_prog_type::BPF_PROG_TYPE_STRUCT_OPS, &insns, name);
    attr.__bindgen_anon_3.expected_attach_type = index;
    attr.__bindgen_anon_3.attach_btf_id = ops_id;
    match sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr, PROG_LOAD_SIZE) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let mut log = vec![0u8; 64 * 1024];
            attr.__bindgen_anon_3.log_level = 1;
            attr.__bindgen_anon_3.log_size = log.len() as u32;
            attr.__bindgen_anon_3.log_buf = log.as_mut_ptr() as u64;
            let _ = sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr, PROG_LOAD_SIZE);
            let text = String::from_utf8_lossy(&log);
            let last: Vec<&str> = text
                .trim_end_matches('\0')
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect();
            bail!(
                "BPF_PROG_LOAD of the struct_ops program for {OPS_TYPE}.{name} (member {index}, \
                 attach_btf_id {ops_id}): {}; verifier: {:?}",
                Errno(&e),
                &last[last.len().saturating_sub(3)..]
            )
        }
    }
}

/// `BPF_BTF_LOAD` up to `btf_log_level`.
const BTF_LOAD_SIZE: u32 =
    attr_size(std::mem::offset_of!(bpf_attr, __bindgen_anon_7.btf_log_level) + 4);

/// The smallest BTF object the kernel takes: one `int`. map_create()
/// (kernel/bpf/syscall.c) takes `btf_fd` for every map with a
/// `btf_vmlinux_value_type_id` ("the bpf_prog.o must have BTF to begin
/// with") and refuses a fd that is not a BTF object with EINVAL; nothing
/// else of it is used for a struct_ops map of a vmlinux type.
fn load_minimal_btf() -> Result<OwnedFd> {
    let mut raw: Vec<u8> = vec![0x9f, 0xeb, 1, 0];
    // hdr_len, type_off, type_len, str_off, str_len.
    for w in [24u32, 0, 16, 16, 5] {
        raw.extend_from_slice(&w.to_le_bytes());
    }
    // INT "int": name_off 1, kind 1, size 4, 32 bits.
    for w in [1u32, 1 << 24, 4, 32] {
        raw.extend_from_slice(&w.to_le_bytes());
    }
    raw.extend_from_slice(b"\0int\0");
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_7.btf = raw.as_ptr() as u64;
    attr.__bindgen_anon_7.btf_size = raw.len() as u32;
    sys_bpf_fd(bpf_cmd::BPF_BTF_LOAD, &mut attr, BTF_LOAD_SIZE)
        .os_ctx("BPF_BTF_LOAD of a one-type BTF object for the struct_ops map's btf_fd")
}

/// Whether the kernel takes a struct_ops program for
/// `tcp_congestion_ops.ssthresh`: BTF can hold the value type while the
/// type was never registered (bpf_tcp_ca_kfunc_init(), a late initcall of
/// net/ipv4/bpf_tcp_ca.c, failed: the verifier then says "attach_btf_id
/// N is not a supported struct", ENOTSUPP). The program is closed again;
/// `Ok(Err(reason))` when the load is refused.
pub fn loads(t: &Types) -> std::result::Result<(), String> {
    let (index, _) = t.ops.member(MEMBERS[0]).expect("checked by types()");
    load_member(t.ops.id, index, MEMBERS[0], 0)
        .map(drop)
        .map_err(|e| {
            format!(
                "{e:#}: the kernel does not take {OPS_TYPE} struct_ops programs (its struct_ops \
                 type was not registered at boot: bpf_tcp_ca_kfunc_init(), net/ipv4/bpf_tcp_ca.c)"
            )
        })
}

/// The struct_ops map of `tcp_congestion_ops`, one entry.
fn create_map(t: &Types, name: &str) -> Result<OwnedFd> {
    let btf = load_minimal_btf()?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_1.btf_fd = btf.as_raw_fd() as u32;
    attr.__bindgen_anon_1.map_type = bpf_map_type::BPF_MAP_TYPE_STRUCT_OPS as u32;
    attr.__bindgen_anon_1.key_size = 4;
    attr.__bindgen_anon_1.value_size = t.value.size;
    attr.__bindgen_anon_1.max_entries = 1;
    attr.__bindgen_anon_1.btf_vmlinux_value_type_id = t.value.id;
    let mut map_name = [0 as libc::c_char; 16];
    for (d, s) in map_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s as libc::c_char;
    }
    attr.__bindgen_anon_1.map_name = map_name;
    sys_bpf_fd(bpf_cmd::BPF_MAP_CREATE, &mut attr, MAP_CREATE_SIZE).os_ctx(format!(
        "BPF_MAP_CREATE of a struct_ops map ({VALUE_TYPE}, BTF id {}, value size {})",
        t.value.id, t.value.size
    ))
}

/// The map's value: zeroes (the kernel refuses a non-zero hole or
/// member it does not handle: check_zero_holes()), `data.name`, and each
/// function member the fd of its program.
fn value(t: &Types, name: &str, progs: &[(u32, OwnedFd)]) -> Result<Vec<u8>> {
    let mut v = vec![0u8; t.value.size as usize];
    let (_, name_off) = t.ops.member("name").expect("checked by types()");
    let at = (t.data + name_off) as usize;
    // TCP_CA_NAME_MAX is 16, with the NUL.
    let bytes = name.as_bytes();
    if bytes.len() > 15 {
        bail!("congestion control name {name:?} is longer than 15 bytes");
    }
    v.get_mut(at..at + bytes.len())
        .ok_or_else(|| {
            anyhow!(
                "{OPS_TYPE}.name at {at} is past the value's {} bytes",
                t.value.size
            )
        })?
        .copy_from_slice(bytes);
    for (off, fd) in progs {
        let at = (t.data + off) as usize;
        v.get_mut(at..at + 8)
            .ok_or_else(|| anyhow!("member at {at} is past the value's {} bytes", t.value.size))?
            .copy_from_slice(&(fd.as_raw_fd() as u64).to_ne_bytes());
    }
    Ok(v)
}

fn elem(cmd: bpf_cmd, map: &OwnedFd, value: Option<&[u8]>) -> std::io::Result<()> {
    let key = 0u32;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_2.map_fd = map.as_raw_fd() as u32;
    attr.__bindgen_anon_2.key = &key as *const u32 as u64;
    if let Some(v) = value {
        attr.__bindgen_anon_2.__bindgen_anon_1.value = v.as_ptr() as u64;
    }
    sys_bpf(cmd, &mut attr, MAP_ELEM_SIZE).map(|_| ())
}

/// Whether the available congestion controls list `name`.
fn listed(name: &str) -> Result<bool> {
    let text = crate::sys::read_trimmed(AVAILABLE).os_ctx(format!("reading {AVAILABLE}"))?;
    Ok(text.split_whitespace().any(|n| n == name))
}

/// Waits (at most `timeout_ms`) until /proc/kallsyms lists no struct_ops
/// trampoline of `tcp_congestion_ops`; returns how long that took.
fn wait_symbols_gone(name: &str, timeout_ms: u64) -> Result<u64> {
    let closed = Instant::now();
    let deadline = closed + Duration::from_millis(timeout_ms);
    loop {
        let left = crate::kallsyms::read_filtered(|e| e.name.starts_with(SYMBOL_PREFIX))?;
        if left.is_empty() {
            return Ok(closed.elapsed().as_millis() as u64);
        }
        if Instant::now() >= deadline {
            bail!(
                "struct-ops: {timeout_ms} ms after the map of {name:?} was closed, /proc/kallsyms \
                 still lists {:?}",
                left.iter().map(|e| &e.name).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The step (`Step::StructOps`).
pub fn run(context: &mut StepContext, name: &str, timeout_ms: u64) -> Result<()> {
    let t = types()?.map_err(|reason| anyhow!("struct-ops: {reason}"))?;
    let mut progs = Vec::new();
    let mut infos = Vec::new();
    for (ret, m) in (0u32..).zip(MEMBERS) {
        let (index, off) = t.ops.member(m).expect("checked by types()");
        let fd = load_member(t.ops.id, index, m, ret)?;
        let info = bpf::prog_info(fd.as_fd())
            .with_context(|| format!("bpf_prog_info of the struct_ops program {m}"))?;
        infos.push((m.to_string(), info));
        progs.push((off, fd));
    }
    let map = create_map(&t, name)?;
    let v = value(&t, name, &progs)?;
    elem(bpf_cmd::BPF_MAP_UPDATE_ELEM, &map, Some(&v)).os_ctx(format!(
        "BPF_MAP_UPDATE_ELEM registering {OPS_TYPE} {name:?}"
    ))?;
    // Registered: the trampolines' symbols and the programs' lines of
    // /proc/kallsyms, in one read.
    let addrs: Vec<u64> = infos
        .iter()
        .flat_map(|(_, i)| i.jited_ksyms.iter().copied())
        .collect();
    let lines = crate::kallsyms::read_filtered(|e| {
        e.name.starts_with(SYMBOL_PREFIX) || addrs.contains(&e.addr)
    })?;
    let trampolines: Vec<KallsymsEntry> = lines
        .iter()
        .filter(|e| e.name.starts_with(SYMBOL_PREFIX))
        .cloned()
        .collect();
    let extents = match crate::jit_books::Books::get() {
        Ok(books) => books
            .ksyms()
            .map(|k| {
                k.into_iter()
                    .filter(|k| k.name.starts_with(SYMBOL_PREFIX))
                    .collect()
            })
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let listed_while = listed(name)?;
    // From here the map's links are the programs' only references: it
    // puts them in member order when it is freed (bpf_struct_ops_map_put_progs(),
    // each link's put queued on one CPU's system workqueue, which runs
    // them in order), so their unloads come in a fixed order. Holding our
    // fds past that would race the map for the last reference.
    drop(progs);
    elem(bpf_cmd::BPF_MAP_DELETE_ELEM, &map, None).os_ctx(format!(
        "BPF_MAP_DELETE_ELEM unregistering {OPS_TYPE} {name:?}"
    ))?;
    let listed_after = listed(name)?;
    // The map's last reference: freed from a worker, its symbols deleted
    // first.
    drop(map);
    let gone_after_ms = wait_symbols_gone(name, timeout_ms)?;
    let mut members = Vec::new();
    for (label, info) in infos {
        let own: Vec<KallsymsEntry> = lines
            .iter()
            .filter(|e| info.jited_ksyms.contains(&e.addr))
            .cloned()
            .collect();
        members.push((label.clone(), info.info.id));
        context.unloaded.push((label.clone(), info.info.id));
        send(&Message::Prog(info.facts(label, &own)))?;
    }
    // wait-unloaded waits for the programs' ids to go.
    send(&Message::StructOps {
        name: name.to_owned(),
        value_type: VALUE_TYPE.to_owned(),
        value_size: t.value.size,
        members,
        trampolines,
        extents,
        listed: listed_while,
        listed_after,
        gone_after_ms,
    })
}
