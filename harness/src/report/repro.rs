//! `repro RUN/TRIAL`: a self-contained reproducer directory for a trial, for
//! a kernel developer who has QEMU and Python 3 but not kloop.
//!
//! It holds the bzImage (and where the pin's package came from, with its
//! sha256), the whole initramfs (agent, modules, payload, the plan), the
//! QEMU command line as `run.sh`, `show-records.py` (a standard-library
//! decoder of what the guest sends, independent of kloop's parser), the
//! expected and actual normalised streams and their diff, the data the
//! trial itself received, and `report.txt`, plain text for a mailing list.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use kloop_path_io::{PathIo, PathIoExt};

use crate::run::suite::{self, EnvOptions};
use crate::run::trial::{BootMode, KernelUnderTest};
use crate::workspace::Layout;

/// The decoder the reproducer ships.
const SHOW_RECORDS: &str = include_str!("show-records.py");

#[derive(Debug, thiserror::Error)]
pub enum ReproError {
    #[error("{0} is not a trial directory: it has no result.json (expected RUN/KERNEL/SCENARIO under target/kloop/runs, e.g. 1795430215-20633/6.1/many-listeners)")]
    NotATrial(PathBuf),
    #[error("reading {path}: {detail}")]
    Read { path: PathBuf, detail: String },
    #[error(transparent)]
    Io(#[from] PathIo),
    #[error("the trial's scenario `{0}` is no longer in scenarios/")]
    UnknownScenario(String),
    #[error(transparent)]
    Suite(#[from] suite::SuiteError),
    #[error("preparing the guest: {0}")]
    Guest(String),
}

/// What was written.
#[derive(Debug)]
pub struct Reproducer {
    pub dir: PathBuf,
    pub files: Vec<String>,
}

/// The trial directory `spec` names: a path, or `RUN/KERNEL/SCENARIO`
/// (`RUN` may be `latest`) under the runs root.
pub fn trial_dir(layout: &Layout, spec: &str) -> Result<PathBuf, ReproError> {
    let direct = PathBuf::from(spec);
    let candidate = if direct.join("result.json").is_file() {
        direct
    } else {
        let (run, rest) = spec.split_once('/').unwrap_or((spec, ""));
        let run_dir = if run == "latest" {
            crate::workspace::run_dirs::list(&layout.runs())
                .into_iter()
                .map(|r| r.path)
                .find(|p| p.join(rest).join("result.json").is_file())
                .unwrap_or_else(|| layout.runs().join("latest"))
        } else {
            layout.runs().join(run)
        };
        run_dir.join(rest)
    };
    if candidate.join("result.json").is_file() {
        Ok(candidate)
    } else {
        Err(ReproError::NotATrial(candidate))
    }
}

/// Writes the reproducer of the trial in `trial` into `out`.
#[expect(clippy::too_many_lines)]
pub fn write(layout: &Layout, trial: &Path, out: &Path) -> Result<Reproducer, ReproError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|e| ReproError::Read {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })
    };
    let result_path = trial.join("result.json");
    let result: serde_json::Value =
        serde_json::from_str(&read(&result_path)?).map_err(|e| ReproError::Read {
            path: result_path.clone(),
            detail: e.to_string(),
        })?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let kernel_id = text(&result["kernel"]);
    let scenario_name = text(&result["scenario"]);
    let scenario = crate::scenario::load_all(&layout.scenarios())
        .map_err(suite::SuiteError::from)?
        .into_iter()
        .find(|s| s.name == scenario_name)
        .ok_or_else(|| ReproError::UnknownScenario(scenario_name.clone()))?;
    // The trial's kernel may be any architecture's (`arm64/6.12`).
    let catalog =
        kloop_kernels::Catalog::load_all(&layout.kernels()).map_err(suite::SuiteError::from)?;
    let kernel = suite::resolve_kernel(&catalog, &kernel_id, None)?;
    let accel = match text(&result["accel"]).as_str() {
        "kvm" => kloop_qemu::accel::AccelChoice::Kvm,
        _ => kloop_qemu::accel::AccelChoice::Tcg,
    };
    let env = suite::prepare_env(
        layout,
        &EnvOptions {
            accel,
            boot: BootMode::BzImage,
            ..EnvOptions::default()
        },
        std::slice::from_ref(&kernel),
    )?;
    std::fs::create_dir_all(out).at("creating", out)?;
    let scratch = env.run_dir.join("repro-scratch");
    let guest = crate::run::trial::standalone_guest(&env, &kernel, &scenario, &scratch)
        .map_err(|v| ReproError::Guest(v.message().unwrap_or("failed").to_string()))?;
    let mut files = Vec::new();
    let mut put = |name: &str, bytes: &[u8], mode: u32| -> Result<(), ReproError> {
        put_file(out, name, bytes, mode)?;
        files.push(name.to_string());
        Ok(())
    };
    let image = std::fs::read(&guest.kernel_file).map_err(|e| ReproError::Read {
        path: guest.kernel_file.clone(),
        detail: e.to_string(),
    })?;
    put("bzImage", &image, 0o644)?;
    put("initramfs.cpio", &guest.initramfs, 0o644)?;
    let vm = kloop_qemu::VmConfig {
        kernel: PathBuf::from("bzImage"),
        initramfs: Some(PathBuf::from("initramfs.cpio")),
        artefacts: PathBuf::from("."),
        ..guest.vm.clone()
    };
    let argv = vm.standalone_argv(Path::new("data.bin"));
    let qemu = kloop_qemu::qemu_binary(vm.arch).0;
    put("run.sh", run_script(&result, &argv, qemu).as_bytes(), 0o755)?;
    put("show-records.py", SHOW_RECORDS.as_bytes(), 0o755)?;
    let plan = serde_json::to_vec_pretty(&scenario.plan).unwrap_or_default();
    put("plan.json", &plan, 0o644)?;
    let actual = std::fs::read_to_string(trial.join("normalised.txt")).ok();
    let snapshot_name = match &kernel {
        KernelUnderTest::Pin(pin) => Some(pin.id.clone()),
        KernelUnderTest::Image(k) => k.snapshot_as.clone(),
        KernelUnderTest::DistroBuild { .. } => None,
    };
    let expected = snapshot_name.and_then(|name| {
        crate::run::trial::snapshot::read_snapshot_body(
            &crate::run::trial::snapshot::snapshot_path(&scenario.snapshot_dir(), &name),
        )
    });
    if let Some(a) = &actual {
        put("actual.txt", a.as_bytes(), 0o644)?;
    }
    if let Some(e) = &expected {
        put("expected.txt", e.as_bytes(), 0o644)?;
    }
    let diff = match (&expected, &actual) {
        (Some(e), Some(a)) if e.trim_end() != a.trim_end() => Some(
            similar::TextDiff::from_lines(e.as_str(), a.as_str())
                .unified_diff()
                .header("expected.txt", "actual.txt")
                .to_string(),
        ),
        _ => None,
    };
    if let Some(d) = &diff {
        put("diff.txt", d.as_bytes(), 0o644)?;
    }
    if let Ok(data) = std::fs::read(trial.join("data.bin")) {
        put("kloop-run-data.bin", &data, 0o644)?;
    }
    let provenance = provenance(&kernel, &guest.kernel_file, &image);
    put("kernel.txt", provenance.as_bytes(), 0o644)?;
    files.push("report.txt".into());
    let report = report_text(
        &result,
        &scenario,
        &provenance,
        diff.as_deref(),
        &files,
        qemu,
    );
    put_file(out, "report.txt", report.as_bytes(), 0o644)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(Reproducer {
        dir: out.to_path_buf(),
        files,
    })
}

fn put_file(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), ReproError> {
    let path = dir.join(name);
    std::fs::write(&path, bytes).at("writing", &path)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .at("writing", &path)?;
    Ok(())
}

/// `argv` as a POSIX shell script run from the reproducer's directory.
fn run_script(result: &serde_json::Value, argv: &[std::ffi::OsString], qemu: &str) -> String {
    // One option and its value per line.
    let mut quoted: Vec<String> = Vec::new();
    for a in argv.iter().map(|a| shell_quote(&a.to_string_lossy())) {
        match quoted.last_mut() {
            Some(last) if last.starts_with('-') && !last.contains(' ') && !a.starts_with('-') => {
                last.push(' ');
                last.push_str(&a);
            }
            _ => quoted.push(a),
        }
    }
    format!(
        "#!/bin/sh\n\
         # Reproduces kloop trial {id}: boots the kernel with kloop's agent as\n\
         # /init, which runs the scenario's plan (plan.json, also inside\n\
         # initramfs.cpio) and powers off. The console is this terminal; what\n\
         # the agent sends (its messages and the raw perf ring bytes) goes to\n\
         # data.bin. Then: ./show-records.py data.bin\n\
         # Needs {qemu} (the trial ran under {accel}; under TCG\n\
         # expect tens of seconds). QEMU=... picks another binary.\n\
         set -eu\n\
         cd \"$(dirname \"$0\")\"\n\
         rm -f data.bin\n\
         \"${{QEMU:-{qemu}}}\" \\\n  {}\n\
         echo\n\
         echo \"guest powered off; decode its records with: ./show-records.py data.bin\"\n",
        quoted.join(" \\\n  "),
        id = result["id"].as_str().unwrap_or("?"),
        accel = result["accel"].as_str().unwrap_or("?"),
    )
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Where the kernel came from, and how to check it is the same one.
fn provenance(kernel: &KernelUnderTest, file: &Path, image: &[u8]) -> String {
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(image));
    let mut s = String::new();
    match kernel {
        KernelUnderTest::Pin(pin) | KernelUnderTest::DistroBuild { pin, .. } => {
            let _ = writeln!(
                s,
                "Debian package {} version {} (suite {}), release {}",
                pin.package, pin.version, pin.suite, pin.release
            );
            let _ = writeln!(s, "package sha256: {}", pin.deb_sha256);
            let _ = writeln!(s, "{} in it, sha256: {}", pin.image_path, pin.image_sha256);
            let _ = writeln!(
                s,
                "to fetch it yourself: apt-get download {}={} (from the {} suite), then\n  \
                 sha256sum the .deb and dpkg-deb -x it",
                pin.package, pin.version, pin.suite
            );
        }
        KernelUnderTest::Image(k) => {
            let _ = writeln!(s, "a local bzImage: {} ({})", k.path.display(), k.name);
        }
    }
    let _ = writeln!(
        s,
        "bzImage here: copied from {}, sha256 {sha}",
        file.display()
    );
    s
}

/// The plain-text report: what was run, what was found, how to see it.
#[expect(clippy::too_many_lines)]
fn report_text(
    result: &serde_json::Value,
    scenario: &crate::scenario::Scenario,
    provenance: &str,
    diff: Option<&str>,
    files: &[String],
    qemu: &str,
) -> String {
    let get = |k: &str| result[k].as_str().unwrap_or("?").to_string();
    let verdict = &result["verdict"];
    let mut s = String::new();
    let rules: Vec<String> = result["violations"]
        .as_array()
        .map(|v| {
            let mut r: Vec<String> = v
                .iter()
                .filter_map(|x| x["rule"].as_str().map(String::from))
                .collect();
            r.dedup();
            r
        })
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "Subject: perf: {} on {}: {}\n",
        if rules.is_empty() {
            verdict["class"].as_str().unwrap_or("?").to_string()
        } else {
            rules.join(", ")
        },
        get("guest_release"),
        scenario.name
    );
    let _ = writeln!(s, "Kernel: {}", get("guest_release"));
    s.push_str(provenance);
    let _ = writeln!(
        s,
        "\nWhat runs: scenario `{}`: {}\n(the steps are in plan.json; the agent opens perf \
         listeners with PERF_RECORD_KSYMBOL / PERF_RECORD_BPF_EVENT enabled, loads and \
         unloads BPF programs, and streams the ring buffers to the host)",
        scenario.name,
        scenario.description.trim()
    );
    let _ = writeln!(
        s,
        "\nWhat kloop found ({}):",
        verdict["class"].as_str().unwrap_or("?")
    );
    match result["violations"].as_array() {
        Some(v) if !v.is_empty() => {
            for x in v.iter().take(10) {
                let _ = writeln!(
                    s,
                    "  [{}] {}",
                    x["rule"].as_str().unwrap_or("?"),
                    x["message"].as_str().unwrap_or("")
                );
            }
            if v.len() > 10 {
                let _ = writeln!(s, "  … and {} more (kloop's result.json)", v.len() - 10);
            }
        }
        _ => {
            let _ = writeln!(
                s,
                "  {}",
                verdict["message"].as_str().unwrap_or("(no message)")
            );
        }
    }
    if let Some(d) = diff {
        let _ = writeln!(
            s,
            "\nThe normalised stream (addresses, ids and times abstracted) against the \
             reviewed one:\n{d}"
        );
    }
    let _ = writeln!(
        s,
        "\nTo reproduce (needs {qemu} and python3, not kloop):\n  \
         ./run.sh                      boots the kernel; the agent runs the plan and powers off\n  \
         ./show-records.py data.bin    decodes every record and flags malformed ones\n\
         kloop-run-data.bin is what the trial itself received (same decoder)."
    );
    let _ = writeln!(
        s,
        "\nFiles: {}\nTrial: {} ({}, QEMU {}, host {})",
        files.join(", "),
        get("id"),
        get("accel"),
        get("qemu_version"),
        get("host_release")
    );
    s
}

/// A reproducer's proof: per kernel, a line for each environment (kloop's
/// guest, then the stock one: the only program of a plain initramfs with
/// the kernel's default limits) with its outcome, what was expected and
/// whether it was met, and the first lines of any message.
pub fn proof_table(
    proof: &crate::run::standalone::ReproProof,
    guest: &[crate::run::standalone::ReproOutcome],
    stock: &[crate::run::standalone::ReproOutcome],
) -> String {
    use crate::run::standalone::ReproOutcome;
    let mut o = String::new();
    for (i, (k, outcome)) in proof.kernels.iter().zip(guest).enumerate() {
        let expected = if k.expected.starts_with('(') {
            k.expected.clone()
        } else {
            format!("must {}", k.expected)
        };
        let flag = |ok: bool| if ok { "" } else { "  ← NOT AS EXPECTED" };
        let _ = writeln!(o, "  {}", k.kernel);
        let guest_ok = k.expect_met_in_guest();
        let mut rows: Vec<(String, &str, bool, Option<&ReproOutcome>)> = vec![(
            "kloop's guest".to_string(),
            k.outcome.as_str(),
            guest_ok,
            Some(outcome),
        )];
        if let Some(s) = &k.stock {
            let env = format!(
                "plain init{}",
                s.memlock.as_deref().map_or(String::new(), |m| format!(
                    " (memlock {m}{})",
                    if m.parse::<u64>().is_ok() { " KiB" } else { "" }
                ))
            );
            rows.push((env, s.outcome.as_str(), s.as_expected, stock.get(i)));
        }
        for (env, label, ok, outcome) in rows {
            let _ = writeln!(o, "    {env:<32} {label:<19} ({expected}){}", flag(ok));
            if let Some(
                ReproOutcome::Reproduces(m)
                | ReproOutcome::CannotRun(m)
                | ReproOutcome::NoAnswer(m),
            ) = outcome
            {
                for line in m.lines().skip(1).take(4) {
                    let _ = writeln!(o, "        {line}");
                }
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_keeps_plain_words_and_quotes_the_rest() {
        assert_eq!(shell_quote("-accel"), "-accel");
        assert_eq!(
            shell_quote("file,id=data,path=data.bin"),
            "file,id=data,path=data.bin"
        );
        assert_eq!(
            shell_quote("console=ttyS0 panic=-1"),
            "'console=ttyS0 panic=-1'"
        );
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
