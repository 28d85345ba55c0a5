//! The tables of `kernels list`, `kernels built`, `kernels available` and
//! the lines of a finished kernel build.

use std::fmt::Write as _;

use kloop_kernels::available::{AvailableBuild, BisectLock};
use kloop_kernels::build::BuiltKernel;
use kloop_kernels::{Catalog, KernelCache};

/// The pins and whether each is in `cache`.
pub fn pins_table(catalog: &Catalog, cache: &KernelCache) -> String {
    let mut out = format!(
        "{:<10} {:<7} {:<40} {:<28} {:<16} cached\n",
        "id", "series", "package", "version", "image sha256"
    );
    for p in catalog.pins() {
        let _ = writeln!(
            out,
            "{:<10} {:<7} {:<40} {:<28} {:<16} {}",
            p.id,
            p.series,
            p.package,
            p.version,
            &p.image_sha256[..16.min(p.image_sha256.len())],
            if cache.is_cached(p) { "yes" } else { "no" }
        );
    }
    let _ = writeln!(out, "cache: {}", cache.root().display());
    out
}

/// The kernels built so far, a line each (or how to build one).
pub fn built_table(all: &[BuiltKernel]) -> String {
    if all.is_empty() {
        return "no built kernels; build one with `cargo xtask kernels build --source linux-source-6.12`\n".to_string();
    }
    let mut out = String::new();
    for k in all {
        let r = &k.record;
        let _ = writeln!(
            out,
            "built:{}  {:<28} {}{}  config {}",
            r.id,
            r.release,
            r.source,
            r.patches
                .iter()
                .map(|p| format!(" +{}", p.path.display()))
                .collect::<String>(),
            &r.config_sha256[..12.min(r.config_sha256.len())]
        );
    }
    out
}

/// The builds the suites serve (of `series` only, when given), each marked
/// with the pin or the bisection lock entry it is, and whether cached.
pub fn available_table(
    builds: &[AvailableBuild],
    series: Option<&str>,
    catalog: &Catalog,
    lock: &BisectLock,
    cache: &KernelCache,
) -> String {
    let mut out = format!(
        "{:<26} {:<7} {:<20} {:<44} pinned\n",
        "version", "series", "suite", "package"
    );
    let shown: Vec<_> = builds
        .iter()
        .filter(|b| series.is_none_or(|s| b.series == s))
        .collect();
    let cached = |yes: bool| if yes { ", cached" } else { "" };
    for b in &shown {
        let pin = catalog
            .pins()
            .iter()
            .find(|p| p.version == b.version && p.arch() == b.arch());
        let locked = lock.get(&b.pin_id());
        let mark = match (pin, locked) {
            (Some(p), _) => format!("pin {}{}", p.id, cached(cache.is_cached(p))),
            (None, Some(p)) => format!("bisect.lock{}", cached(cache.is_cached(p))),
            (None, None) => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<26} {:<7} {:<20} {:<44} {mark}",
            b.version, b.series, b.suite, b.package
        );
    }
    let _ = writeln!(out, "{} build(s)", shown.len());
    out
}

/// What a finished build says: its id, release, source and patches, how
/// it was had (cache, incremental or full build, with the time), where its
/// image, config and log are, and the build's notes.
pub fn built_lines(k: &BuiltKernel) -> Vec<String> {
    let r = &k.record;
    let mut lines = vec![
        format!(
            "built:{} {} ({}){}: {}",
            r.id,
            r.release,
            r.source,
            if r.patches.is_empty() {
                String::new()
            } else {
                format!(" + {} patch(es)", r.patches.len())
            },
            if k.cached {
                "already built, from the cache".to_string()
            } else {
                format!(
                    "{} build in {:.0} s",
                    if r.incremental { "incremental" } else { "full" },
                    r.build_secs
                )
            }
        ),
        format!(
            "  image {}, config {}, log {}",
            k.image().display(),
            k.config_path().display(),
            k.log().display()
        ),
    ];
    lines.extend(r.notes.iter().map(|n| format!("  note: {n}")));
    lines
}
