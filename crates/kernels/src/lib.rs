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
mod cache;
mod error;
mod extract;
mod mirror;
mod modules;
mod pin;
pub mod pvh;
mod update;
mod version;

pub use cache::{FetchOptions, KernelCache};
pub use error::KernelError;
pub use extract::bzimage_release;
pub use mirror::{host_mirror, mirror_from_apt_sources, AptSourceFile};
pub use modules::{Compression, ModuleSet, ShippedModule};
pub use pin::{Catalog, KernelPin};
pub use update::{create_pin, update_pin, PinSpec};
pub use version::compare_debian_versions;

/// Environment variable overriding the Debian mirror URL.
pub const MIRROR_ENV: &str = "KLOOP_MIRROR";
/// Environment variable overriding the cache root.
pub const CACHE_DIR_ENV: &str = "KLOOP_CACHE_DIR";
/// Environment variable overriding the keyring used to verify Release files.
pub const KEYRING_ENV: &str = "KLOOP_KEYRING";
/// The host keyring used when neither [`FetchOptions::keyring`] nor
/// [`KEYRING_ENV`] say otherwise.
pub const DEFAULT_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
