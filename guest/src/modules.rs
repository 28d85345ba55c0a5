//! Kernel modules the host shipped: it put the files a scenario needs (and,
//! on arm64, the data channel's own) in [`kloop_protocol::MODULES_DIR`]
//! with an `order` file (dependencies first); [`insert`] loads a module
//! and what it depends on with `finit_module`.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;

use anyhow::{anyhow, bail, Context, Result};
use kloop_protocol::MODULES_DIR;

use crate::sys::{Errno, OsContext};

/// One line of the host's order file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OrderLine {
    name: String,
    /// Guest path, or `None` for a built-in module.
    file: Option<String>,
    /// The kernel decompresses this file itself (`MODULE_INIT_COMPRESSED_FILE`).
    compressed: bool,
    depends: Vec<String>,
}

fn parse_order(text: &str) -> Result<Vec<OrderLine>> {
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let [name, file, how, depends] = fields[..] else {
            bail!(
                "line {} of the module order file has {} fields, not 4: {line:?}",
                n + 1,
                fields.len()
            );
        };
        let (file, compressed) = match how {
            "builtin" => (None, false),
            "plain" => (Some(file.to_owned()), false),
            "xz" | "zstd" | "gzip" => (Some(file.to_owned()), true),
            other => bail!(
                "line {} of the module order file: unknown kind {other:?}",
                n + 1
            ),
        };
        lines.push(OrderLine {
            name: name.to_owned(),
            file,
            compressed,
            depends: depends
                .split(',')
                .filter(|d| !d.is_empty())
                .map(str::to_owned)
                .collect(),
        });
    }
    Ok(lines)
}

/// The lines `name` needs, in file order (dependencies come first there).
fn closure<'a>(order: &'a [OrderLine], name: &str) -> Result<Vec<&'a OrderLine>> {
    let name = name.replace('-', "_");
    let mut needed = std::collections::HashSet::new();
    let mut todo = vec![name.clone()];
    while let Some(n) = todo.pop() {
        if !needed.insert(n.clone()) {
            continue;
        }
        let line = order.iter().find(|l| l.name == n).ok_or_else(|| {
            if n == name {
                let shipped: Vec<&str> = order.iter().map(|l| l.name.as_str()).collect();
                anyhow!(
                    "module {n} was not shipped (the initramfs has {shipped:?}): add it to \
                         the scenario's `modules` list"
                )
            } else {
                anyhow!("module {n}, a dependency, is missing from the order file")
            }
        })?;
        todo.extend(line.depends.iter().cloned());
    }
    Ok(order.iter().filter(|l| needed.contains(&l.name)).collect())
}

/// Inserts `name` and its dependencies; one line per module saying what
/// happened. Already loaded or built in is not an error.
pub fn insert(name: &str) -> Result<Vec<String>> {
    let path = format!("{MODULES_DIR}/order");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
            "no {path}: the host shipped no modules; list {name:?} in the scenario's `modules`"
        ),
        Err(e) => return Err(e).os_ctx(format!("reading {path}")),
    };
    let order = parse_order(&text)?;
    let mut outcomes = Vec::new();
    for line in closure(&order, name)? {
        let Some(file) = &line.file else {
            outcomes.push(format!("{} is built into the kernel", line.name));
            continue;
        };
        let outcome = finit_module(file, line.compressed)
            .with_context(|| format!("inserting module {} from {file}", line.name))?;
        outcomes.push(format!("{}: {outcome}", line.name));
    }
    Ok(outcomes)
}

/// `MODULE_INIT_COMPRESSED_FILE` (uapi `linux/module.h`, 5.17+, honoured only
/// with `CONFIG_MODULE_DECOMPRESS`: the host ships a compressed file only
/// when the kernel's config says so).
const MODULE_INIT_COMPRESSED_FILE: libc::c_uint = 4;

fn finit_module(file: &str, compressed: bool) -> Result<&'static str> {
    let f = std::fs::File::open(file).os_ctx(format!("opening {file}"))?;
    let params = CString::default();
    let flags = if compressed {
        MODULE_INIT_COMPRESSED_FILE
    } else {
        0
    };
    // SAFETY: a valid fd, a NUL-terminated empty parameter string, flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_finit_module,
            f.as_raw_fd(),
            params.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        return Ok(if compressed {
            "inserted (the kernel decompressed it)"
        } else {
            "inserted"
        });
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        return Ok("already loaded");
    }
    bail!("finit_module: {}", Errno(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_closure_takes_dependencies_in_file_order() {
        let text = "udp_tunnel\t/kloop/modules/udp_tunnel.ko.xz\txz\t\n\
                    ip6_udp_tunnel\t/kloop/modules/ip6_udp_tunnel.ko\tplain\tudp_tunnel\n\
                    vxlan\t/kloop/modules/vxlan.ko\tplain\tudp_tunnel,ip6_udp_tunnel\n\
                    veth\t/kloop/modules/veth.ko\tplain\t\n\
                    tcp_cubic\t-\tbuiltin\t\n";
        let order = parse_order(text).unwrap();
        let names: Vec<&str> = closure(&order, "vxlan")
            .unwrap()
            .iter()
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(names, ["udp_tunnel", "ip6_udp_tunnel", "vxlan"]);
        assert!(order[0].compressed && !order[1].compressed);
        assert_eq!(closure(&order, "tcp_cubic").unwrap()[0].file, None);
        let err = closure(&order, "bridge").unwrap_err().to_string();
        assert!(err.contains("was not shipped"), "{err}");
        assert!(parse_order("veth\t/x\tlzma\t\n").is_err());
    }
}
