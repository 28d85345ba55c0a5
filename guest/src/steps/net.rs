//! Kernel modules and virtual network devices.
//!
//! Modules: the host put the files a scenario needs in
//! [`kloop_protocol::MODULES_DIR`] with an `order` file (dependencies
//! first); `modprobe` inserts a module and what it depends on with
//! `finit_module`. Devices: a hand-written `NETLINK_ROUTE` conversation
//! (RTM_NEWLINK / RTM_DELLINK, uapi `linux/rtnetlink.h`, `if_link.h`,
//! `veth.h`); the agent needs four messages, not a netlink library.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{anyhow, bail, Context, Result};

use crate::channel::log;
use crate::sys::{Errno, OsContext};

/// The `modprobe` step: inserts `name` and what it depends on, logging
/// what happened to each.
pub fn modprobe(name: &str) -> Result<()> {
    for outcome in crate::modules::insert(name)? {
        log(format!("modprobe {name}: {outcome}"))?;
    }
    Ok(())
}

/// The `veth` step: creates the pair `name` / `peer` and brings it up.
pub fn veth(name: &str, peer: &str) -> Result<()> {
    create_veth(name, peer)?;
    log(format!(
        "veth pair {name} (ifindex {}) / {peer} (ifindex {}) created and up",
        ifindex(name)?,
        ifindex(peer)?
    ))
}

/// The `Requirement::Veth` probe: the veth module loads (or is built in or
/// already loaded) and a pair can be made and removed again. `Err` says
/// why not, for the `Unsupported` message (a string: a probe's answer,
/// said as-is).
pub fn veth_probe() -> Result<(), String> {
    let describe = |e: anyhow::Error| crate::sys::describe_chain(&e);
    crate::modules::insert("veth").map_err(describe)?;
    let (a, b) = ("kloopprobe0", "kloopprobe1");
    create_veth(a, b).map_err(describe)?;
    delete_link(a).map_err(describe)?;
    // Deleting one end deletes the pair; make sure the peer went with it.
    match ifindex(b) {
        Err(_) => Ok(()),
        Ok(index) => Err(format!(
            "deleting {a} left its peer {b} (ifindex {index}) behind"
        )),
    }
}

// rtnetlink, from include/uapi/linux/{netlink,rtnetlink,if_link,veth}.h.
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
/// In an NLMSG_ERROR: extended-ack attributes follow.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// In an NLMSG_ERROR: the request is not echoed (only its header).
const NLM_F_CAPPED: u16 = 0x100;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NETLINK_CAP_ACK: libc::c_int = 10;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_HDRLEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;

/// A netlink message under construction: header, then the body.
struct NlMsg {
    buf: Vec<u8>,
}

impl NlMsg {
    fn new(kind: u16, flags: u16, seq: u32) -> NlMsg {
        let mut buf = vec![0u8; NLMSG_HDRLEN];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        NlMsg { buf }
    }

    /// `struct ifinfomsg` (family, type, index, flags, change).
    fn ifinfomsg(&mut self, index: i32, flags: u32, change: u32) -> &mut Self {
        let mut m = [0u8; IFINFOMSG_LEN];
        m[0] = libc::AF_UNSPEC as u8;
        m[4..8].copy_from_slice(&index.to_ne_bytes());
        m[8..12].copy_from_slice(&flags.to_ne_bytes());
        m[12..16].copy_from_slice(&change.to_ne_bytes());
        self.buf.extend_from_slice(&m);
        self
    }

    fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Self {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    fn str_attr(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut data = s.as_bytes().to_vec();
        data.push(0);
        self.attr(kind, &data)
    }

    /// Starts a nested attribute; returns its offset for [`NlMsg::end`].
    fn begin(&mut self, kind: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        at
    }

    fn end(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn finish(&mut self) -> &[u8] {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        &self.buf
    }
}

fn check_ifname(name: &str) -> Result<()> {
    // IFNAMSIZ is 16 with the NUL; the kernel refuses '/', ':' and blanks.
    if name.is_empty()
        || name.len() > 15
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        bail!("{name:?} is not a valid interface name (1-15 characters, no '/', ':' or blanks)");
    }
    Ok(())
}

/// Creates the veth pair `name` / `peer` and brings both up.
fn create_veth(name: &str, peer: &str) -> Result<()> {
    check_ifname(name)?;
    check_ifname(peer)?;
    let sock = Netlink::open()?;
    let mut msg = NlMsg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 1);
    msg.ifinfomsg(0, 0, 0).str_attr(IFLA_IFNAME, name);
    let linkinfo = msg.begin(IFLA_LINKINFO);
    msg.str_attr(IFLA_INFO_KIND, "veth");
    let data = msg.begin(IFLA_INFO_DATA);
    // VETH_INFO_PEER carries a whole ifinfomsg and the peer's attributes.
    let peer_at = msg.begin(VETH_INFO_PEER);
    msg.ifinfomsg(0, 0, 0).str_attr(IFLA_IFNAME, peer);
    msg.end(peer_at);
    msg.end(data);
    msg.end(linkinfo);
    sock.request(msg.finish(), 1).map_err(|e| {
        let hint = if e.raw == libc::EOPNOTSUPP {
            " (no `veth` link kind: is the veth module inserted? a `modprobe` step must come first)"
        } else {
            ""
        };
        anyhow!("creating veth pair {name}/{peer} (RTM_NEWLINK): {e}{hint}")
    })?;
    for (seq, dev) in [(2, name), (3, peer)] {
        let index = ifindex(dev)?;
        let up = libc::IFF_UP as u32;
        let mut msg = NlMsg::new(RTM_NEWLINK, 0, seq);
        msg.ifinfomsg(index, up, up);
        sock.request(msg.finish(), seq)
            .map_err(|e| anyhow!("bringing {dev} up (RTM_NEWLINK, IFF_UP): {e}"))?;
    }
    Ok(())
}

fn delete_link(name: &str) -> Result<()> {
    let sock = Netlink::open()?;
    let mut msg = NlMsg::new(RTM_DELLINK, 0, 1);
    msg.ifinfomsg(ifindex(name)?, 0, 0);
    sock.request(msg.finish(), 1)
        .map_err(|e| anyhow!("deleting {name} (RTM_DELLINK): {e}"))
}

fn ifindex(name: &str) -> Result<i32> {
    let c = CString::new(name).context("interface name with a NUL")?;
    // SAFETY: a NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error()).os_ctx(format!("if_nametoindex({name})"));
    }
    Ok(index as i32)
}

/// A netlink error answer: the errno and the kernel's extended-ack text.
#[derive(Debug)]
struct NlError {
    raw: i32,
    message: Option<String>,
}

impl std::fmt::Display for NlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = io::Error::from_raw_os_error(self.raw);
        write!(f, "{}", Errno(&e))?;
        if let Some(m) = &self.message {
            write!(f, ": kernel says {m:?}")?;
        }
        Ok(())
    }
}

struct Netlink {
    fd: OwnedFd,
}

impl Netlink {
    fn open() -> Result<Netlink> {
        // SAFETY: plain socket(2).
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error()).os_ctx("socket(AF_NETLINK, NETLINK_ROUTE)");
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let on: libc::c_int = 1;
        for opt in [NETLINK_EXT_ACK, NETLINK_CAP_ACK] {
            // Best effort: older kernels without extended acks still answer.
            // SAFETY: an int option of the right size.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_NETLINK,
                    opt,
                    (&on as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        // An answer that never comes becomes an error naming the request,
        // not a silent agent the host has to time out.
        let timeout = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: a timeval option of the right size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error()).os_ctx("setsockopt(SO_RCVTIMEO) on netlink");
        }
        Ok(Netlink { fd })
    }

    /// Sends one request and waits for its ack.
    fn request(&self, msg: &[u8], seq: u32) -> std::result::Result<(), NlError> {
        let os = |e: io::Error| NlError {
            raw: e.raw_os_error().unwrap_or(libc::EIO),
            message: Some(format!("netlink socket: {e}")),
        };
        // SAFETY: a zeroed sockaddr_nl is the kernel as destination.
        let mut dest: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        dest.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: buffer and address valid for the call.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&dest as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(os(io::Error::last_os_error()));
        }
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: buffer valid for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Err(NlError {
                        raw: libc::ETIMEDOUT,
                        message: Some("no answer from the kernel within 5 s".into()),
                    });
                }
                return Err(os(e));
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
                let flags = u16::from_ne_bytes(rest[6..8].try_into().unwrap());
                let got_seq = u32::from_ne_bytes(rest[8..12].try_into().unwrap());
                if len < NLMSG_HDRLEN || len > rest.len() {
                    return Err(NlError {
                        raw: libc::EPROTO,
                        message: Some(format!("malformed netlink answer (length {len})")),
                    });
                }
                let body = &rest[NLMSG_HDRLEN..len];
                if kind == NLMSG_ERROR && got_seq == seq && body.len() >= 4 {
                    let error = i32::from_ne_bytes(body[0..4].try_into().unwrap());
                    if error == 0 {
                        return Ok(());
                    }
                    return Err(NlError {
                        raw: -error,
                        message: ext_ack_message(body, flags),
                    });
                }
                rest = &rest[len.next_multiple_of(4).min(rest.len())..];
            }
        }
    }
}

/// The `NLMSGERR_ATTR_MSG` of an error answer, if the kernel sent one.
fn ext_ack_message(body: &[u8], flags: u16) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    // int error, then the offending request: its header only when capped.
    let echoed = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        let len = u32::from_ne_bytes(body.get(4..8)?.try_into().ok()?) as usize;
        len.next_multiple_of(4)
    };
    let mut attrs = body.get(4 + echoed..)?;
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes(attrs[0..2].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(attrs[2..4].try_into().ok()?);
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NLMSGERR_ATTR_MSG {
            let text = &attrs[4..len];
            let text = text.split(|&b| b == 0).next().unwrap_or(text);
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newlink_message_nests_the_peer() {
        let mut msg = NlMsg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 7);
        msg.ifinfomsg(0, 0, 0).str_attr(IFLA_IFNAME, "a");
        let at = msg.begin(IFLA_LINKINFO);
        msg.str_attr(IFLA_INFO_KIND, "veth");
        msg.end(at);
        let bytes = msg.finish().to_vec();
        assert_eq!(
            bytes.len() as u32,
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap())
        );
        assert_eq!(bytes.len() % 4, 0);
        // header 16 + ifinfomsg 16 + IFNAME (4+2 → 8) + LINKINFO (4 + KIND 4+5 → 12) = 56
        assert_eq!(bytes.len(), 56);
        let linkinfo = &bytes[40..44];
        assert_eq!(u16::from_ne_bytes([linkinfo[0], linkinfo[1]]), 16);
        assert_eq!(
            u16::from_ne_bytes([linkinfo[2], linkinfo[3]]),
            IFLA_LINKINFO | NLA_F_NESTED
        );
    }
}
