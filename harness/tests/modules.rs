//! Module resolution over the real pinned packages (no VM): for every pin,
//! `veth` and `vxlan` (which
//! needs `udp_tunnel` and `ip6_udp_tunnel`) are found, ordered dependencies
//! first, checked against the release and decompressed where the kernel
//! cannot. Resolution runs in a fresh cache that borrows only the verified
//! `.deb`s, so nothing is answered from an earlier run's module cache.
//! Packages missing from the shared kernel cache are fetched into it, as
//! the VM trials would.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a test binary reports on the terminal

use std::path::Path;

use kloop_kernels::{Catalog, Compression, FetchOptions, KernelCache};

#[test]
fn veth_and_vxlan_resolve_in_every_cached_pin() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let catalog = Catalog::load(&root.join("kernels")).unwrap();
    let shared = KernelCache::default_location().unwrap();
    let offline = FetchOptions {
        offline: true,
        ..FetchOptions::default()
    };
    let mut resolved = 0;
    for pin in catalog.pins() {
        let deb = shared
            .ensure_modules_deb(pin, &FetchOptions::default())
            .unwrap_or_else(|e| panic!("pin {}: {e}", pin.id));
        let fresh = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(fresh.path().join("debs")).unwrap();
        std::os::unix::fs::symlink(
            &deb,
            fresh.path().join("debs").join(deb.file_name().unwrap()),
        )
        .unwrap();
        let cache = KernelCache::at(fresh.path());
        let names = ["vxlan".to_string(), "veth".to_string()];
        let set = cache.ensure_modules(pin, &names, &offline).unwrap();
        let order: Vec<&str> = set.modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            order,
            ["udp_tunnel", "ip6_udp_tunnel", "vxlan", "veth"],
            "pin {}",
            pin.id
        );
        assert_eq!(set.release, pin.release);
        // Only 6.12's package proves (by its config) that the kernel
        // decompresses its .ko.xz; everything else ships plain.
        let kept: Vec<Option<Compression>> =
            set.modules.iter().map(|m| m.kernel_decompresses).collect();
        let expect_kept = pin.id == "6.12";
        assert!(
            kept.iter()
                .all(|k| k.is_some() == expect_kept && k.is_none_or(|c| c == Compression::Xz)),
            "pin {}: {kept:?}",
            pin.id
        );
        // The second call is answered from the new module cache.
        let again = cache.ensure_modules(pin, &names, &offline).unwrap();
        assert_eq!(again, set);
        let order_file = set.order_file();
        assert!(
            order_file.starts_with("udp_tunnel\t/kloop/modules/udp_tunnel.ko"),
            "{order_file}"
        );
        eprintln!(
            "pin {}: {} module(s), {} bytes shipped",
            pin.id,
            set.modules.len(),
            set.shipped_bytes()
        );
        resolved += 1;
    }
    assert_eq!(resolved, catalog.pins().len());
}
