//! Saved VMs: one cold boot per kernel × VM shape, saved where the agent
//! awaits its plan; every trial of that shape restores it and gets its plan
//! over the data channel.
//!
//! Every restore starts from the same memory image, so nothing one trial
//! leaves behind reaches the next: isolation is that of a cold boot. A saved
//! VM is keyed on everything that shapes it — the kernel file's and the
//! plan-less initramfs's sha256, QEMU's version and its argv (accelerator,
//! CPUs, memory, command line, firmware, `KLOOP_QEMU_ARGS`) — and rebuilt
//! when any of them changes. They live in the kernel cache
//! (`saved-vms/<key>/`: `vmstate`, `initramfs.cpio`, `meta.json`, and
//! `boot/` with the saved boot's console), pruned by [`Budgets`]: the
//! pins' saved VMs past [`KEEP_ENV`] (default [`DEFAULT_KEEP`]) and, apart
//! from them, throwaway kernels' (validate's candidates and baselines,
//! bisection steps, mutants) past [`KEEP_OTHERS_ENV`] (default
//! [`DEFAULT_KEEP_OTHERS`]), least recently used first within each, each
//! removal said. Other commands' work therefore never evicts a pin's saved
//! VM: only more pins' saved VMs than their budget do.
//!
//! When saving or restoring fails, the trial boots cold and says why; a
//! shape whose save failed is not tried again in the same run.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kloop_kernels::lock::HolderLock;
use kloop_path_io::{PathIo, PathIoExt};
use kloop_protocol::{Plan, ToGuest};
use kloop_qemu::{GuestStart, Vm, VmConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The kernel a saved VM is for, as [`SavedVms::ensure`] needs it.
#[derive(Debug, Clone, Copy)]
pub struct SavedVmKernel<'a> {
    /// Its label (a pin's name or a build's id), said in the notes.
    pub label: &'a str,
    /// Whether it is a pin: pins' saved VMs are pruned last.
    pub pin: bool,
    /// Whether a missing saved VM is made (else `Err`).
    pub make: MakeSavedVm,
}

/// Whether a trial makes its shape's saved VM when there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MakeSavedVm {
    Always,
    /// No: the run has only this many trials of a throwaway kernel (a
    /// validate candidate, a bisection step) on this VM shape, and a saved
    /// VM costs a boot and a save that no later run reuses, more than the
    /// few cold boots it would spare. One already saved is still restored.
    NotForFew(usize),
}

/// Why a trial has no saved VM to restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoSavedVm {
    /// None is saved, and the trial was told not to make one
    /// ([`MakeSavedVm::NotForFew`]): booting cold is the plan, not a fault.
    NotMade { trials: usize },
    /// Finding, making or restoring one failed: why.
    Failed(String),
}

impl std::fmt::Display for NoSavedVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoSavedVm::NotMade { trials } => write!(
                f,
                "this throwaway kernel has {trials} trial(s) of this VM shape in the run, and a \
                 cold boot each costs less than a saved VM (a boot and a save) that no later \
                 run restores"
            ),
            NoSavedVm::Failed(why) => f.write_str(why),
        }
    }
}

/// Fewer trials than this of a throwaway kernel on one VM shape boot cold
/// rather than make a saved VM. Under TCG making one (a boot to the agent's
/// plan request, the pre-save reads, the save) takes 8-10 s, and each
/// restore saves a 1.5-2 s boot and about 0.5 s of /proc/kallsyms reads
/// (see the guest's `kallsyms.rs`): about four trials pay for it.
pub const FEW_TRIALS_FOR_A_SAVED_VM: usize = 4;

/// How many saved VMs of kernel pins the cache keeps (least recently used
/// go first).
pub const KEEP_ENV: &str = "KLOOP_SAVED_VMS_KEEP";
/// About 100 MB of disk each for a 512 MiB guest (the RAM file is sparse:
/// only the pages the guest touched take space): a full matrix restores 20
/// on x86-64 (4 VM shapes × 5 pins) and 10 on arm64 (2 shapes: the perf
/// scenarios, among others, are SKIPPED there before a boot), 30 for
/// `--arch all` (docs/usage.md's table, from the recorded run), and after a change to the agent the previous ones
/// stay until these are used more recently.
pub const DEFAULT_KEEP: usize = 80;
/// How many saved VMs of kernels that are not pins (validate's, bisection
/// steps', mutants') the cache keeps, apart from the pins' budget.
pub const KEEP_OTHERS_ENV: &str = "KLOOP_SAVED_VMS_KEEP_OTHERS";
/// A validate's baseline and candidate make at most a few each (a shape
/// with fewer than [`FEW_TRIALS_FOR_A_SAVED_VM`] trials makes none), so
/// the baseline's survive from one validate to the next; a bisection's
/// steps, never restored again, take turns in what is left.
pub const DEFAULT_KEEP_OTHERS: usize = 15;

/// Prefix of a saved VM's directory renamed aside to be removed: a reader
/// never sees a saved VM half removed, and a removal a kill interrupted is
/// finished by the next prune.
const REMOVING: &str = "removing-";

/// How many saved VMs of each kind the cache keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Kernel pins' (`kernels/*.toml`): what every `vm-test` restores.
    pub pins: usize,
    /// Every other kernel's, and entries whose kind cannot be read.
    pub others: usize,
}

impl Budgets {
    /// [`KEEP_ENV`] and [`KEEP_OTHERS_ENV`], or their defaults; at least
    /// one each.
    pub fn from_env() -> Budgets {
        let var = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(default)
                .max(1)
        };
        Budgets {
            pins: var(KEEP_ENV, DEFAULT_KEEP),
            others: var(KEEP_OTHERS_ENV, DEFAULT_KEEP_OTHERS),
        }
    }

    fn of(&self, pin: bool) -> usize {
        if pin {
            self.pins
        } else {
            self.others
        }
    }
}

/// A saved VM this process made: for the run's phases.
#[derive(Debug, Clone, PartialEq)]
pub struct MadeSavedVm {
    pub key: String,
    pub kernel: String,
    pub pin: bool,
    /// From QEMU's start to `meta.json` written: the boot to the agent's
    /// plan request, the save, the renames.
    pub secs: f64,
}

/// Bumped when what a saved VM holds changes meaning (the agent's waiting
/// protocol, the layout of the directory).
const FORMAT: u32 = 2;

/// How long a trial waits for another kloop process that is saving the
/// same VM before it boots cold.
const OTHER_PROCESS_WAIT: Duration = Duration::from_secs(180);

/// What `meta.json` says about a saved VM.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SavedVmMeta {
    pub key: String,
    /// The `-kernel` file it was booted from (a restore passes the same).
    pub kernel: PathBuf,
    pub kernel_bytes: u64,
    pub qemu_version: String,
    /// Seconds since the epoch.
    pub created: u64,
    /// QEMU start to the agent's `AwaitingPlan`.
    pub boot_to_ready_secs: f64,
    pub save_secs: f64,
    pub guest_uptime_secs: f64,
    pub vmstate_bytes: u64,
    /// The guest's RAM file (`ram`): its length, the guest's memory size.
    pub ram_bytes: u64,
    /// Made for a kernel pin, or restored by one since: counted in the
    /// pins' budget ([`Budgets::pins`]), which other kernels' saved VMs
    /// (validate's, bisection steps', mutants') never take from.
    #[serde(default)]
    pub pin: bool,
}

/// A saved VM on disk, complete.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedVm {
    pub dir: PathBuf,
    pub meta: SavedVmMeta,
    /// Whether this run created it (its boot and save are then part of the
    /// trial that asked first).
    pub created_now: bool,
}

impl SavedVm {
    pub fn key(&self) -> &str {
        &self.meta.key
    }
    fn vmstate(&self) -> PathBuf {
        self.dir.join("vmstate")
    }
    fn ram(&self) -> PathBuf {
        self.dir.join("ram")
    }
    fn initramfs(&self) -> PathBuf {
        self.dir.join("initramfs.cpio")
    }
    fn boot_console(&self) -> PathBuf {
        self.dir.join("boot").join("console.log")
    }
}

type Slot = Arc<Mutex<Option<Result<SavedVm, SaveFailed>>>>;

/// Why a shape has no saved VM (or one cannot be restored): the trial
/// boots cold, and the text is said in its note. Clone: a shape's verdict
/// is kept for the run, so the errors it holds are shared.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SaveFailed {
    #[error("{0}")]
    Io(Arc<PathIo>),
    #[error("building the initramfs: {0}")]
    Initramfs(Arc<io::Error>),
    #[error("{0}")]
    Meta(Arc<serde_json::Error>),
    /// The boot to save: what QEMU or the agent said, and where the boot's
    /// console is.
    #[error("saving a VM failed ({why}); its boot's console: {}", console.display())]
    Save { why: String, console: PathBuf },
    #[error("restoring it failed earlier in this run: {0}")]
    RestoreFailedEarlier(String),
    #[error("the saved VM's kernel file {} changed or went away", .0.display())]
    KernelChanged(PathBuf),
    #[error("interrupted")]
    Interrupted,
    #[error("{who} held {} for {secs} s while saving the same VM", path.display())]
    LockHeld {
        who: String,
        path: PathBuf,
        secs: u64,
    },
}

impl From<PathIo> for SaveFailed {
    fn from(e: PathIo) -> SaveFailed {
        SaveFailed::Io(Arc::new(e))
    }
}

/// The saved VMs of one run: the directory, and per key what this run
/// found (so one failure is not retried by every trial of the shape).
pub struct SavedVms {
    root: PathBuf,
    slots: Mutex<HashMap<String, Slot>>,
    /// The caller's description of an initramfs's inputs → its sha256.
    initramfs_digests: Mutex<HashMap<String, String>>,
    /// What this process made, and how many it removed by pruning.
    made: Mutex<Vec<MadeSavedVm>>,
    removed: std::sync::atomic::AtomicUsize,
}

impl SavedVms {
    /// The store under `cache_root/saved-vms`.
    pub fn in_cache(cache_root: &Path) -> SavedVms {
        SavedVms {
            root: cache_root.join("saved-vms"),
            slots: Mutex::default(),
            initramfs_digests: Mutex::default(),
            made: Mutex::default(),
            removed: Default::default(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The saved VMs this process made, in the order they were finished.
    pub fn made(&self) -> Vec<MadeSavedVm> {
        lock(&self.made).clone()
    }

    /// How many saved VMs this process removed past [`Budgets`].
    pub fn removed(&self) -> usize {
        self.removed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The saved VM of `shape` (a configuration without initramfs), made
    /// now if there is none. `initramfs_inputs` names what the plan-less
    /// initramfs is built from (equal inputs, equal bytes within one run),
    /// `initramfs` builds it. `Err`: why the trial must boot cold.
    /// `kernel`: its label, whether it is a pin (pins' saved VMs are
    /// pruned last) and whether a missing saved VM is made (else `Err`).
    pub fn ensure(
        &self,
        kernel: SavedVmKernel<'_>,
        shape: &VmConfig,
        qemu_version: &str,
        initramfs_inputs: &str,
        initramfs: &dyn Fn() -> io::Result<Vec<u8>>,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<SavedVm, NoSavedVm> {
        let SavedVmKernel { pin, make, .. } = kernel;
        fn failed(why: impl std::fmt::Display) -> NoSavedVm {
            NoSavedVm::Failed(format!("no saved VM: {why}"))
        }
        let mut bytes = None;
        let initramfs_sha = {
            let known = lock(&self.initramfs_digests).get(initramfs_inputs).cloned();
            match known {
                Some(sha) => sha,
                None => {
                    let b =
                        initramfs().map_err(|e| failed(format!("building the initramfs: {e}")))?;
                    let sha = hex::encode(Sha256::digest(&b));
                    lock(&self.initramfs_digests).insert(initramfs_inputs.to_string(), sha.clone());
                    bytes = Some(b);
                    sha
                }
            }
        };
        let kernel_sha = kloop_kernels::sha256_file(&shape.kernel)
            .map_err(|e| failed(format!("hashing {}: {e}", shape.kernel.display())))?;
        let key = key_of(shape, qemu_version, &kernel_sha, &initramfs_sha);
        let slot = lock(&self.slots).entry(key.clone()).or_default().clone();
        let mut slot = lock(&slot);
        if let Some(known) = slot.as_ref() {
            return known
                .clone()
                .map(|mut vm| {
                    vm.created_now = false;
                    vm
                })
                .map_err(failed);
        }
        let dir = self.root.join(&key);
        let found = match (read_complete(&dir), make) {
            (Some(vm), _) => Ok(vm),
            // Left unrecorded in the slot: a trial of the same shape that
            // may make it still does.
            (None, MakeSavedVm::NotForFew(trials)) => return Err(NoSavedVm::NotMade { trials }),
            (None, MakeSavedVm::Always) => {
                let bytes = match bytes {
                    Some(b) => Ok(b),
                    None => initramfs().map_err(|e| SaveFailed::Initramfs(Arc::new(e))),
                };
                bytes.and_then(|b| self.create(&key, kernel, shape, qemu_version, &b, interrupted))
            }
        };
        let found = found.map(|vm| if pin { mark_pin(vm) } else { vm });
        if let Ok(vm) = &found {
            touch(&vm.dir);
        }
        *slot = Some(found.clone());
        found.map_err(failed)
    }

    /// A restore of `saved` running `plan`, its artefacts in `artefacts`
    /// (whose `console.log` starts with the saved boot's).
    pub fn restore_config(
        &self,
        saved: &SavedVm,
        shape: &VmConfig,
        plan: &Plan,
        artefacts: &Path,
    ) -> Result<VmConfig, SaveFailed> {
        let kernel_now = std::fs::metadata(&saved.meta.kernel).map(|m| m.len()).ok();
        if kernel_now != Some(saved.meta.kernel_bytes) {
            return Err(SaveFailed::KernelChanged(saved.meta.kernel.clone()));
        }
        let mut console = std::fs::read(saved.boot_console()).unwrap_or_default();
        console.extend_from_slice(
            format!(
                "\n[kloop] ---- restored from saved VM {} (booted {} s into the guest's life); \
                 the trial's own output follows ----\n",
                saved.key(),
                saved.meta.guest_uptime_secs
            )
            .as_bytes(),
        );
        std::fs::write(artefacts.join("console.log"), console)
            .doing(format!("writing {}/console.log", artefacts.display()))?;
        touch(&saved.dir);
        Ok(VmConfig {
            kernel: saved.meta.kernel.clone(),
            initramfs: Some(saved.initramfs()),
            artefacts: artefacts.to_path_buf(),
            start: GuestStart::Restore {
                vmstate: saved.vmstate(),
                ram: saved.ram(),
                to_guest: ToGuest::Plan { plan: plan.clone() }.to_frame(),
            },
            ..shape.clone()
        })
    }

    /// A restore of `saved` failed: the rest of this run boots its shape
    /// cold, and the next run makes it again.
    pub fn forget(&self, saved: &SavedVm, why: &str) {
        if let Some(slot) = lock(&self.slots).get(saved.key()) {
            *lock(slot) = Some(Err(SaveFailed::RestoreFailedEarlier(why.to_string())));
        }
        let _ = std::fs::remove_dir_all(&saved.dir);
    }

    fn create(
        &self,
        key: &str,
        kernel: SavedVmKernel<'_>,
        shape: &VmConfig,
        qemu_version: &str,
        initramfs: &[u8],
        interrupted: &dyn Fn() -> bool,
    ) -> Result<SavedVm, SaveFailed> {
        let SavedVmKernel {
            label: kernel_label,
            pin,
            ..
        } = kernel;
        let dir = self.root.join(key);
        std::fs::create_dir_all(&self.root).doing(format!("creating {}", self.root.display()))?;
        let _lock = wait_for_lock(&self.root.join(format!("{key}.lock")), interrupted)?;
        let started = Instant::now();
        // Another process may have made it while this one waited.
        if let Some(vm) = read_complete(&dir) {
            return Ok(vm);
        }
        let _ = std::fs::remove_dir_all(&dir);
        let boot_dir = dir.join("boot");
        std::fs::create_dir_all(&boot_dir).doing(format!("creating {}", boot_dir.display()))?;
        let initramfs_path = dir.join("initramfs.cpio");
        std::fs::write(&initramfs_path, initramfs)
            .doing(format!("writing {}", initramfs_path.display()))?;
        let partial = dir.join("vmstate.partial");
        let ram_partial = dir.join("ram.partial");
        let config = VmConfig {
            initramfs: Some(initramfs_path),
            artefacts: boot_dir,
            // The trial's own deadlines (a fault test's short ones) apply
            // to its restore, not to the boot every trial shares; a checked
            // kernel's longer ones do.
            deadlines: kloop_qemu::Deadlines::for_accel(shape.accel).at_least(shape.deadlines),
            start: GuestStart::BootAndSave {
                vmstate: partial.clone(),
                ram: ram_partial.clone(),
            },
            ..shape.clone()
        };
        let report =
            match boot_to_save(config, kernel_label, &key[..16.min(key.len())], interrupted) {
                Ok(r) => r,
                Err(why) => {
                    // Keep the boot's artefacts for the user, not the state.
                    let _ = std::fs::remove_file(&partial);
                    let _ = std::fs::remove_file(&ram_partial);
                    return Err(SaveFailed::Save {
                        why: why.to_string(),
                        console: dir.join("boot").join("console.log"),
                    });
                }
            };
        let vmstate = dir.join("vmstate");
        let ram = dir.join("ram");
        for (from, to) in [(&partial, &vmstate), (&ram_partial, &ram)] {
            std::fs::rename(from, to).doing(format!("renaming {}", from.display()))?;
        }
        let meta = SavedVmMeta {
            key: key.to_string(),
            kernel: shape.kernel.clone(),
            kernel_bytes: std::fs::metadata(&shape.kernel)
                .map(|m| m.len())
                .unwrap_or(0),
            qemu_version: qemu_version.to_string(),
            created: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            boot_to_ready_secs: report.boot_to_ready.as_secs_f64(),
            save_secs: report.save.as_secs_f64(),
            guest_uptime_secs: report.guest_uptime_ns as f64 / 1e9,
            vmstate_bytes: std::fs::metadata(&vmstate).map(|m| m.len()).unwrap_or(0),
            ram_bytes: std::fs::metadata(&ram).map(|m| m.len()).unwrap_or(0),
            pin,
        };
        // Written last, and whole: a saved VM with its meta.json is complete.
        write_meta(&dir, &meta)?;
        lock(&self.made).push(MadeSavedVm {
            key: key.to_string(),
            kernel: kernel_label.to_string(),
            pin,
            secs: started.elapsed().as_secs_f64(),
        });
        self.prune(key, pin, Budgets::from_env());
        Ok(SavedVm {
            dir,
            meta,
            created_now: true,
        })
    }

    /// Keeps each kind of saved VM within its [`Budgets`] (`keep`, just
    /// made, of kind `keep_pin`, counted but never removed): past a budget
    /// the least recently used of that kind go, so a throwaway kernel's
    /// saved VM never removes a pin's. Each removal is said. One held by
    /// another process (being made) is skipped; a removal renames the
    /// directory aside first, so no reader sees it half removed.
    fn prune(&self, keep: &str, keep_pin: bool, budgets: Budgets) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let mut saved = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.path().is_dir() || name == keep {
                continue;
            }
            if name.starts_with(REMOVING) {
                // Another process removing it now, or a removal killed
                // halfway: either way it is garbage.
                let _ = std::fs::remove_dir_all(e.path());
                continue;
            }
            saved.push(candidate(&e.path()));
        }
        for c in eviction_order(saved, keep_pin, budgets) {
            let name = c.dir.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            let lock_path = self.root.join(format!("{name}.lock"));
            // A saved VM being made right now by another process holds its
            // lock; skip it (and a lock whose file another pruner removed).
            let Ok(Some(lock)) = HolderLock::try_take(&lock_path) else {
                continue;
            };
            if !lock.is_current() {
                continue;
            }
            let aside = self
                .root
                .join(format!("{REMOVING}{name}-{}", std::process::id()));
            if std::fs::rename(&c.dir, &aside).is_err() {
                continue;
            }
            // Removed while held: a waiter on this file sees it is no
            // longer current and takes the lock again (`wait_for_lock`).
            let _ = std::fs::remove_file(&lock_path);
            drop(lock);
            let _ = std::fs::remove_dir_all(&aside);
            self.removed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (kind, budget) = if c.pin {
                (KEEP_ENV, budgets.pins)
            } else {
                (KEEP_OTHERS_ENV, budgets.others)
            };
            crate::run::status::done(
                &format!("saved-vm-prune {}", c.dir.display()),
                &format!(
                    "removed the saved VM {} ({}, least recently used past {kind}={budget})",
                    c.dir.display(),
                    c.label
                ),
            );
        }
    }
}

/// Why [`boot_to_save`] made no saved VM: QEMU's or the save's own error.
#[derive(Debug, thiserror::Error)]
enum BootToSave {
    #[error("{0}")]
    Spawn(kloop_qemu::VmError),
    #[error("{0}")]
    Save(kloop_qemu::SavedVmError),
}

/// Boots `config` once and saves it when the agent awaits its plan, saying
/// so on the status line (`short` names the saved VM there).
fn boot_to_save(
    config: VmConfig,
    kernel_label: &str,
    short: &str,
    interrupted: &dyn Fn() -> bool,
) -> Result<kloop_qemu::SaveReport, BootToSave> {
    let task = format!("save {short}");
    crate::run::status::start(
        &task,
        &format!(
            "{kernel_label}: no saved VM of this kernel × VM shape yet ({short}): booting it \
             once to save it"
        ),
    );
    let result = Vm::spawn(config)
        .map_err(BootToSave::Spawn)
        .and_then(|mut vm| vm.save_when_awaiting(interrupted).map_err(BootToSave::Save));
    match &result {
        Ok(r) => crate::run::status::done(
            &task,
            &format!(
                "{kernel_label}: saved VM {short} made: {:.1} s to the agent's plan \
                 request, {:.1} s to save",
                r.boot_to_ready.as_secs_f64(),
                r.save.as_secs_f64()
            ),
        ),
        Err(why) => crate::run::status::failed(&task, &format!("saving a VM failed: {why}")),
    }
    result
}

/// Writes `meta` as `dir`'s meta.json through a rename, so that a reader
/// never sees half of it.
fn write_meta(dir: &Path, meta: &SavedVmMeta) -> Result<(), SaveFailed> {
    let json = serde_json::to_vec_pretty(meta).map_err(|e| SaveFailed::Meta(Arc::new(e)))?;
    let tmp = dir.join("meta.json.partial");
    std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, dir.join("meta.json")))
        .doing(format!("writing {}/meta.json", dir.display()))?;
    Ok(())
}

/// A saved VM's directory as pruning sees it: its kind (from `meta.json`;
/// an unreadable or incomplete one counts as a throwaway kernel's) and
/// when it was last used (the `used` file's mtime, else the directory's).
fn candidate(dir: &Path) -> Candidate {
    let used = std::fs::metadata(dir.join("used"))
        .or_else(|_| std::fs::metadata(dir))
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let meta = read_complete(dir).map(|vm| vm.meta);
    Candidate {
        pin: meta.as_ref().is_some_and(|m| m.pin),
        label: match meta {
            Some(m) => format!(
                "{} of {}",
                if m.pin { "a pin" } else { "a throwaway kernel" },
                m.kernel.display()
            ),
            None => "incomplete, or made by an older kloop".into(),
        },
        used,
        dir: dir.to_path_buf(),
    }
}

/// A saved VM pruning may remove.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    pin: bool,
    used: SystemTime,
    label: String,
    dir: PathBuf,
}

/// What to remove so that each kind keeps at most its budget, counting
/// the one just made (of kind `kept_pin`, not among `saved`): per kind, the
/// least recently used first. The pins' saved VMs are counted only against
/// [`Budgets::pins`], so no number of throwaway kernels' saved VMs removes
/// one of them.
fn eviction_order(saved: Vec<Candidate>, kept_pin: bool, budgets: Budgets) -> Vec<Candidate> {
    let mut out = Vec::new();
    for pin in [false, true] {
        let mut kind: Vec<Candidate> = saved.iter().filter(|c| c.pin == pin).cloned().collect();
        let count = kind.len() + usize::from(kept_pin == pin);
        let excess = count.saturating_sub(budgets.of(pin)).min(kind.len());
        kind.sort_by_key(|c| c.used);
        out.extend(kind.into_iter().take(excess));
    }
    out
}

/// A saved VM a pin restores is the pin's from now on, whoever made it (a
/// bisection step of the same Debian build, a run of the pin's image as a
/// plain file): `meta.json` says `pin`, rewritten atomically (a new file
/// renamed over the old); when that fails it stays as it was.
fn mark_pin(vm: SavedVm) -> SavedVm {
    if vm.meta.pin {
        return vm;
    }
    let meta = SavedVmMeta {
        pin: true,
        ..vm.meta.clone()
    };
    let tmp = vm
        .dir
        .join(format!("meta.json.{}.partial", std::process::id()));
    let written = serde_json::to_vec_pretty(&meta)
        .map_err(io::Error::other)
        .and_then(|json| std::fs::write(&tmp, json))
        .and_then(|()| std::fs::rename(&tmp, vm.dir.join("meta.json")));
    match written {
        Ok(()) => SavedVm { meta, ..vm },
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(
                "saved VM {}: marking it a pin's failed: {e}",
                vm.dir.display()
            );
            vm
        }
    }
}

/// The key: sha256 over the format, QEMU's version, the kernel's and the
/// initramfs's digests and QEMU's argv with this guest's own paths (console,
/// sockets, files) replaced by placeholders; 16 hex digits.
pub fn key_of(
    shape: &VmConfig,
    qemu_version: &str,
    kernel_sha: &str,
    initramfs_sha: &str,
) -> String {
    let neutral = VmConfig {
        kernel: PathBuf::from("/kernel"),
        initramfs: Some(PathBuf::from("/initramfs")),
        artefacts: PathBuf::from("/artefacts"),
        start: GuestStart::Boot,
        ..shape.clone()
    };
    let argv: Vec<String> = neutral
        .argv(Path::new("/qmp"), Path::new("/data"))
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut h = Sha256::new();
    h.update(format!(
        "format {FORMAT}\nqemu {qemu_version}\nkernel {kernel_sha}\ninitramfs {initramfs_sha}\n"
    ));
    for a in argv {
        h.update(a.as_bytes());
        h.update(b"\0");
    }
    hex::encode(h.finalize())[..16].to_string()
}

fn read_complete(dir: &Path) -> Option<SavedVm> {
    let meta: SavedVmMeta =
        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).ok()?).ok()?;
    let state = std::fs::metadata(dir.join("vmstate")).ok()?;
    let ram = std::fs::metadata(dir.join("ram")).ok()?;
    (state.len() == meta.vmstate_bytes && ram.len() == meta.ram_bytes && meta.ram_bytes > 0).then(
        || SavedVm {
            dir: dir.to_path_buf(),
            meta,
            created_now: false,
        },
    )
}

/// Marks a saved VM used now (pruning goes by this file's mtime).
fn touch(dir: &Path) {
    let _ = std::fs::File::create(dir.join("used"));
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the `flock` on a saved VM's lock file, so two kloop processes
/// never save the same VM at once (released when the lock is dropped),
/// waiting for another process that holds it and saying whom it waits for
/// (the file names its holder, [`kloop_kernels::lock`]).
fn wait_for_lock(path: &Path, interrupted: &dyn Fn() -> bool) -> Result<HolderLock, SaveFailed> {
    let deadline = Instant::now() + OTHER_PROCESS_WAIT;
    let task = format!("lock {}", path.display());
    let mut said = false;
    loop {
        match HolderLock::try_take(path) {
            // Its file was removed by a pruner while this one waited: take
            // the lock at the path again.
            Ok(Some(l)) if !l.is_current() => continue,
            Ok(Some(l)) => {
                if said {
                    crate::run::status::done(&task, "");
                }
                return Ok(l);
            }
            Ok(None) => {}
            Err(e) => return Err(PathIo::doing(format!("locking {}", path.display()), e).into()),
        }
        let who =
            kloop_kernels::lock::holder(path).unwrap_or_else(|| "another kloop process".into());
        if !said {
            said = true;
            crate::run::status::start(
                &task,
                &format!(
                    "waiting for the lock on {}, held by {who}, which is saving the same VM",
                    path.display()
                ),
            );
        }
        if interrupted() {
            return Err(SaveFailed::Interrupted);
        }
        if Instant::now() >= deadline {
            return Err(SaveFailed::LockHeld {
                who,
                path: path.to_path_buf(),
                secs: OTHER_PROCESS_WAIT.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> VmConfig {
        VmConfig {
            arch: kloop_protocol::Arch::X86_64,
            qemu: "/usr/bin/qemu-system-x86_64".into(),
            kernel: "/cache/vmlinux/aaaa".into(),
            initramfs: None,
            accel: kloop_qemu::Accel::Tcg,
            cpus: 2,
            memory_mib: 512,
            cmdline: Vec::new(),
            artefacts: "/runs/1/6.1/basic".into(),
            deadlines: kloop_qemu::Deadlines::for_accel(kloop_qemu::Accel::Tcg),
            data_channel: true,
            icount: false,
            channel_limit: kloop_qemu::DEFAULT_CHANNEL_LIMIT,
            start: GuestStart::Boot,
            console: Default::default(),
        }
    }

    /// Told not to make one, `ensure` makes none (no QEMU runs, nothing
    /// is written) and says so as `NotMade`; a complete saved VM of the
    /// same key is still found.
    #[test]
    fn a_trial_told_not_to_make_one_restores_only_what_exists() {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("vmlinux");
        std::fs::write(&kernel, b"kernel bytes").unwrap();
        let shape = VmConfig {
            kernel: kernel.clone(),
            ..shape()
        };
        let cache = dir.path().join("cache");
        let vms = SavedVms::in_cache(&cache);
        let initramfs = || Ok(b"initramfs bytes".to_vec());
        let ensure = |vms: &SavedVms| {
            vms.ensure(
                SavedVmKernel {
                    label: "built-0123",
                    pin: false,
                    make: MakeSavedVm::NotForFew(2),
                },
                &shape,
                "QEMU 7.2",
                "inputs",
                &initramfs,
                &|| false,
            )
        };
        assert_eq!(ensure(&vms).err(), Some(NoSavedVm::NotMade { trials: 2 }));
        let saved = std::fs::read_dir(vms.root()).map_or(0, |d| d.count());
        assert_eq!(saved, 0, "nothing may be made");

        let key = key_of(
            &shape,
            "QEMU 7.2",
            &hex::encode(Sha256::digest(b"kernel bytes")),
            &hex::encode(Sha256::digest(b"initramfs bytes")),
        );
        saved_on_disk(vms.root(), &key, &kernel, false, 0);
        // The same handle: the refusal was not remembered for the key.
        let found = ensure(&vms).unwrap();
        assert_eq!((found.key(), found.created_now), (key.as_str(), false));
    }

    #[test]
    fn key_ignores_the_trials_own_paths_and_deadlines() {
        let a = shape();
        let b = VmConfig {
            artefacts: "/runs/2/6.1/kprobes".into(),
            kernel: "/elsewhere/same-bytes".into(),
            deadlines: kloop_qemu::Deadlines {
                boot: Duration::from_secs(1),
                silence: Duration::from_secs(1),
                total: Duration::from_secs(1),
            },
            ..shape()
        };
        assert_eq!(key_of(&a, "7.2", "k", "i"), key_of(&b, "7.2", "k", "i"));
        assert_eq!(key_of(&a, "7.2", "k", "i").len(), 16);
    }

    #[test]
    fn key_changes_with_everything_that_shapes_the_guest() {
        let key = |c: VmConfig| key_of(&c, "7.2", "k", "i");
        let base = key(shape());
        let variants = [
            key_of(&shape(), "8.0", "k", "i"),
            key_of(&shape(), "7.2", "k2", "i"),
            key_of(&shape(), "7.2", "k", "i2"),
            key(VmConfig { cpus: 1, ..shape() }),
            key(VmConfig {
                memory_mib: 1024,
                ..shape()
            }),
            key(VmConfig {
                icount: true,
                ..shape()
            }),
            key(VmConfig {
                cmdline: vec!["nokaslr".into()],
                ..shape()
            }),
            key(VmConfig {
                accel: kloop_qemu::Accel::Kvm,
                ..shape()
            }),
        ];
        for (n, v) in variants.iter().enumerate() {
            assert_ne!(&base, v, "variant {n} kept the key");
        }
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    fn cand(name: &str, pin: bool, used: u64) -> Candidate {
        Candidate {
            pin,
            used: at(used),
            label: name.into(),
            dir: PathBuf::from(name),
        }
    }

    fn names(v: Vec<Candidate>) -> Vec<String> {
        v.into_iter().map(|c| c.label).collect()
    }

    /// Each kind keeps its own budget, least recently used first: a pin's
    /// saved VM is never removed for a throwaway kernel's, however old.
    #[test]
    fn each_kind_keeps_its_own_budget() {
        let saved = vec![
            cand("pin-old", true, 1),
            cand("cand-new", false, 9),
            cand("pin-new", true, 8),
            cand("cand-old", false, 2),
            cand("step", false, 5),
        ];
        let budgets = |pins, others| Budgets { pins, others };
        // A throwaway one just made: 4 throwaway against 2, pins untouched
        // although pin-old was used longer ago than any.
        assert_eq!(
            names(eviction_order(saved.clone(), false, budgets(2, 2))),
            ["cand-old", "step"]
        );
        // A pin's just made: 3 pins against 2; the throwaway ones are 3
        // against 3.
        assert_eq!(
            names(eviction_order(saved.clone(), true, budgets(2, 3))),
            ["pin-old"]
        );
        assert_eq!(
            names(eviction_order(saved.clone(), true, budgets(1, 1))),
            ["cand-old", "step", "pin-old", "pin-new"]
        );
        assert!(eviction_order(saved, false, budgets(3, 4)).is_empty());
    }

    /// Both architectures' matrices' saved VMs (`wave`, more than half the
    /// pins' budget), then a bisection's and validates' 40, each pruned as
    /// it is made (the default budgets): every pin's is still there, and
    /// the newest throwaway ones fill their budget.
    #[test]
    fn forty_throwaway_saved_vms_after_the_pins_evict_no_pin() {
        let budgets = Budgets {
            pins: DEFAULT_KEEP,
            others: DEFAULT_KEEP_OTHERS,
        };
        let wave = DEFAULT_KEEP / 2 + 5;
        let mut cache: Vec<Candidate> = Vec::new();
        let make = |c: Candidate, cache: &mut Vec<Candidate>| {
            for gone in eviction_order(cache.clone(), c.pin, budgets) {
                cache.retain(|k| k != &gone);
            }
            cache.push(c);
        };
        for i in 0..wave {
            make(cand(&format!("pin-{i}"), true, i as u64), &mut cache);
        }
        for i in 0..40 {
            make(cand(&format!("step-{i}"), false, 1000 + i), &mut cache);
        }
        let pins = cache.iter().filter(|c| c.pin).count();
        assert_eq!(pins, wave, "no pin's saved VM removed");
        let others: Vec<_> = cache.iter().filter(|c| !c.pin).map(|c| &c.label).collect();
        assert_eq!(others.len(), DEFAULT_KEEP_OTHERS);
        assert_eq!(others[0], &format!("step-{}", 40 - DEFAULT_KEEP_OTHERS));
        // The pins' budget still holds the previous agent's alongside: the
        // least recently used pins go, not the ones just made.
        for i in 0..wave {
            make(
                cand(&format!("new-pin-{i}"), true, 2000 + i as u64),
                &mut cache,
            );
        }
        let pins: Vec<_> = cache.iter().filter(|c| c.pin).map(|c| &c.label).collect();
        assert_eq!(pins.len(), DEFAULT_KEEP);
        assert_eq!(pins[0], &format!("pin-{}", 2 * wave - DEFAULT_KEEP));
        assert_eq!(cache.iter().filter(|c| !c.pin).count(), DEFAULT_KEEP_OTHERS);
    }

    /// A complete saved VM in `root` of kind `pin`, last used at `used`.
    fn saved_on_disk(root: &Path, key: &str, kernel: &Path, pin: bool, used: u64) -> PathBuf {
        let d = root.join(key);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vmstate"), b"state").unwrap();
        std::fs::write(d.join("ram"), b"guest memory").unwrap();
        let meta = SavedVmMeta {
            key: key.into(),
            kernel: kernel.to_path_buf(),
            kernel_bytes: 12,
            qemu_version: "QEMU 7.2".into(),
            created: 0,
            boot_to_ready_secs: 1.0,
            save_secs: 0.5,
            guest_uptime_secs: 1.0,
            vmstate_bytes: 5,
            ram_bytes: 12,
            pin,
        };
        std::fs::write(d.join("meta.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
        let used_file = std::fs::File::create(d.join("used")).unwrap();
        used_file.set_modified(at(used)).unwrap();
        d
    }

    /// Pruning on disk: past each budget the least recently used of that
    /// kind go, with their lock files; one whose lock another process
    /// holds (being made) stays; a removal left halfway is finished; the
    /// entry just made is never removed.
    #[test]
    fn pruning_on_disk_keeps_each_budget_and_skips_what_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let vms = SavedVms::in_cache(dir.path());
        let root = vms.root().to_path_buf();
        let k = Path::new("/k");
        for (key, pin, used) in [
            ("pin-a", true, 1),
            ("pin-b", true, 2),
            ("pin-c", true, 3),
            ("step-a", false, 10),
            ("step-b", false, 11),
            ("step-c", false, 12),
            ("just-made", false, 13),
        ] {
            saved_on_disk(&root, key, k, pin, used);
            std::fs::write(root.join(format!("{key}.lock")), "").unwrap();
        }
        std::fs::create_dir_all(root.join("removing-old-1/boot")).unwrap();
        // Another process holds step-a's lock: it is being made again.
        let held = HolderLock::try_take(&root.join("step-a.lock"))
            .unwrap()
            .unwrap();
        vms.prune("just-made", false, Budgets { pins: 3, others: 2 });
        let mut left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "just-made",
                "just-made.lock",
                "pin-a",
                "pin-a.lock",
                "pin-b",
                "pin-b.lock",
                "pin-c",
                "pin-c.lock",
                "step-a",
                "step-a.lock",
                "step-c",
                "step-c.lock",
            ]
        );
        assert_eq!(vms.removed(), 1, "step-b only: step-a is held");
        drop(held);
    }

    /// A saved VM a throwaway kernel made becomes the pin's once a pin's
    /// trial restores it, so a later prune counts it in the pins' budget.
    #[test]
    fn a_saved_vm_a_pin_restores_becomes_the_pins() {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("vmlinux");
        std::fs::write(&kernel, b"kernel bytes").unwrap();
        let shape = VmConfig {
            kernel: kernel.clone(),
            ..shape()
        };
        let vms = SavedVms::in_cache(&dir.path().join("cache"));
        let key = key_of(
            &shape,
            "QEMU 7.2",
            &hex::encode(Sha256::digest(b"kernel bytes")),
            &hex::encode(Sha256::digest(b"initramfs bytes")),
        );
        let d = saved_on_disk(vms.root(), &key, &kernel, false, 1);
        let found = vms
            .ensure(
                SavedVmKernel {
                    label: "6.1",
                    pin: true,
                    make: MakeSavedVm::Always,
                },
                &shape,
                "QEMU 7.2",
                "inputs",
                &|| Ok(b"initramfs bytes".to_vec()),
                &|| false,
            )
            .unwrap();
        assert!(found.meta.pin);
        assert!(read_complete(&d).unwrap().meta.pin, "meta.json says so");
        assert!(vms.made().is_empty(), "restored, not made");
    }

    #[test]
    fn only_complete_saved_vms_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("0123456789abcdef");
        std::fs::create_dir_all(&d).unwrap();
        assert!(read_complete(&d).is_none(), "empty directory");
        std::fs::write(d.join("vmstate"), b"12345").unwrap();
        assert!(read_complete(&d).is_none(), "no meta.json");
        let meta = SavedVmMeta {
            key: "0123456789abcdef".into(),
            kernel: "/k".into(),
            kernel_bytes: 1,
            qemu_version: "q".into(),
            created: 0,
            boot_to_ready_secs: 1.0,
            save_secs: 0.5,
            guest_uptime_secs: 1.0,
            vmstate_bytes: 6,
            ram_bytes: 4,
            pin: true,
        };
        std::fs::write(d.join("meta.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
        std::fs::write(d.join("ram"), b"1234").unwrap();
        assert!(
            read_complete(&d).is_none(),
            "vmstate shorter than meta says"
        );
        std::fs::write(d.join("vmstate"), b"123456").unwrap();
        std::fs::remove_file(d.join("ram")).unwrap();
        assert!(read_complete(&d).is_none(), "no RAM file");
        std::fs::write(d.join("ram"), b"12").unwrap();
        assert!(
            read_complete(&d).is_none(),
            "RAM file shorter than meta says"
        );
        std::fs::write(d.join("ram"), b"1234").unwrap();
        assert_eq!(read_complete(&d).map(|v| v.meta), Some(meta));
    }
}
