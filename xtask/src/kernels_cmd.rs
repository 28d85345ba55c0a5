//! `kernels …`: the catalog, source builds, the builds the mirror serves.

use std::process::ExitCode;

use anyhow::Result;
use kloop::session::kernels;
use kloop::workspace::Layout;

use crate::flags::*;
use crate::shared::*;

impl Run for KernelsCmd {
    fn run(self) -> Result<ExitCode> {
        kernels(self)
    }
}

/// `cargo xtask kernels …`: one function per subcommand.
fn kernels(cmd: KernelsCmd) -> Result<ExitCode> {
    let layout = layout();
    match cmd {
        KernelsCmd::List => list(&layout),
        KernelsCmd::Fetch { ids, fetch } => fetch_pins(&layout, &ids, &fetch),
        KernelsCmd::Build(a) => build(&layout, a),
        KernelsCmd::Built => built(),
        KernelsCmd::Available {
            series,
            arch,
            refresh,
            fetch,
        } => match arch {
            ArchChoice::One(arch) => available(&layout, series.as_deref(), arch, refresh, &fetch),
            ArchChoice::All => {
                anyhow::bail!("kernels available lists one architecture: --arch x86_64 or arm64")
            }
        },
        KernelsCmd::PinBuild {
            versions,
            arch,
            fetch,
        } => pin_build(&layout, versions, arch.one("kernels pin-build")?, &fetch),
        KernelsCmd::PinSource {
            package,
            suite,
            fetch,
        } => pin_source(&layout, &package, &suite, &fetch),
        KernelsCmd::Update {
            id,
            same_version,
            fetch,
        } => update(&layout, &id, same_version, &fetch),
    }
}

/// `kernels list`: the pins and whether they are cached.
fn list(layout: &Layout) -> Result<ExitCode> {
    let pins = kernels::list(layout)?;
    print!(
        "{}",
        kloop::report::kernels::pins_table(&pins.catalog, &pins.cache)
    );
    Ok(ExitCode::SUCCESS)
}

/// `kernels fetch`: the images (and .config and modules packages) of the pins.
fn fetch_pins(layout: &Layout, ids: &[String], fetch: &FetchArgs) -> Result<ExitCode> {
    kernels::fetch(layout, ids, &fetch.options(), &mut |p, f| {
        println!(
            "{} {} {}: {} ({:.1} s)",
            p.id, f.package, p.version, f.got, f.secs
        );
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `kernels build`: a kernel from source.
fn build(layout: &Layout, a: BuildArgs) -> Result<ExitCode> {
    let req = a.request(layout)?;
    let what = req.source.label();
    Ok(match build_kernel(&req, &what) {
        Ok(k) if req.controls.is_some() && !run_controls(layout, &k, &a.fetch)? => {
            ExitCode::FAILURE
        }
        Ok(k) => {
            println!(
                "kloop: run it with `cargo xtask vm-test --kernel built:{}`",
                k.record.id
            );
            ExitCode::SUCCESS
        }
        Err(code) => code,
    })
}

/// `kernels built`: the kernels built so far.
fn built() -> Result<ExitCode> {
    let all = kernels::built()?;
    print!("{}", kloop::report::kernels::built_table(&all));
    Ok(ExitCode::SUCCESS)
}

/// `kernels available`: every build the Debian suites serve.
fn available(
    layout: &Layout,
    series: Option<&str>,
    arch: kloop::Arch,
    refresh: bool,
    fetch: &FetchArgs,
) -> Result<ExitCode> {
    let av = kernels::available(layout, arch, refresh, &fetch.options())?;
    let table = kloop::report::kernels::available_table(
        &av.builds,
        series,
        &av.catalog,
        &av.lock,
        &av.cache,
    );
    print!("{table}");
    for n in av.notes {
        println!("note: {n}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `kernels pin-build`: builds into the bisection lock.
fn pin_build(
    layout: &Layout,
    versions: Vec<String>,
    arch: kloop::Arch,
    fetch: &FetchArgs,
) -> Result<ExitCode> {
    kernels::pin_build(layout, &versions, arch, &fetch.options(), &mut |pin| {
        println!(
            "{}: {} {} (deb sha256 {}, image sha256 {}) in kernels/bisect.lock",
            pin.id, pin.package, pin.suite, pin.deb_sha256, pin.image_sha256
        );
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `kernels pin-source`: a kernel source package.
fn pin_source(layout: &Layout, package: &str, suite: &str, fetch: &FetchArgs) -> Result<ExitCode> {
    let pin = kernels::pin_source(layout, package, suite, &fetch.options())?;
    println!(
        "{}: pinned {} from {} (deb sha256 {})",
        pin.package, pin.version, pin.suite, pin.deb_sha256
    );
    Ok(ExitCode::SUCCESS)
}

/// `kernels update`: moves a pin.
fn update(layout: &Layout, id: &str, same_version: bool, fetch: &FetchArgs) -> Result<ExitCode> {
    let pin = kernels::update(layout, id, same_version, &fetch.options())?;
    println!(
        "{}: pinned {} {} (deb sha256 {}, image sha256 {})",
        pin.id, pin.package, pin.version, pin.deb_sha256, pin.image_sha256
    );
    Ok(ExitCode::SUCCESS)
}
