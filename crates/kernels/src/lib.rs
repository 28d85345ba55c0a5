//! Kernel pins: the catalog in `kernels/*.toml`, the Debian mirror, and a
//! verified, content-addressed cache of kernel images.
//!
//! Data flow: [`Catalog`] → [`KernelPin`] → [`KernelCache::ensure_image`] →
//! path of a bzImage whose sha256 matches the pin.
//!
//! # Trust chain
//!
//! A pin is created by [`update_pin`] / [`create_pin`] from a package index
//! whose `InRelease` signature apt verified against the Debian archive
//! keyring (`signed-by=`, the host's `debian-archive-keyring.gpg` unless
//! overridden); apt then checks the downloaded `.deb` against the signed
//! index, and we record the `.deb`'s sha256 and the sha256 of the image inside
//! it in the pin. Those two hashes, reviewed and committed with the pin, are
//! the trust anchor from then on: every later fetch recomputes both and
//! refuses a mismatch, so fetching a *pinned* kernel does not depend on the
//! host keyring (an index that no longer verifies — e.g. an old host keyring
//! that lacks a newer archive key — is then used unverified, the hash pin
//! being what protects the download). Creating or moving a pin never accepts
//! an unverified index.

mod apt;
mod atomic;
pub mod available;
pub use atomic::write_atomically;
pub mod build;
mod cache;
pub mod config;
mod error;
mod extract;
pub mod guest_tool;
pub mod lock;
mod mirror;
mod modules;
mod pin;
pub mod pvh;
mod settings;
pub mod space;
pub mod status;
mod update;
mod version;

pub use cache::{
    dir_bytes, CacheInUse, CleanParts, Cleaned, FetchOptions, Fetched, KernelCache, PinnedDeb,
};
pub use config::{KernelConfig, OptionState};
pub use error::KernelError;
pub use extract::{
    arm64_image_release, bzimage_release, image_release, is_arm64_image, is_arm64_image_file,
    sha256_file,
};
pub use mirror::{
    host_mirror, locate_host_mirror, mirror_from_apt_sources, AptSourceFile, HostOs, Mirror,
    MirrorOrigin,
};
pub use modules::{Compression, ModuleSet, ShippedModule};
pub use pin::{Catalog, KernelPin, Needs, PackageOf};
pub use settings::{CACHE_DIR_ENV, DEFAULT_KEYRING, KEYRING_ENV, MIRROR_ENV};
pub use update::{create_pin, update_pin, PinSpec};
pub use version::compare_debian_versions;
