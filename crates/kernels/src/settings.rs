//! The environment variables and defaults that steer where kernels come
//! from and where they are kept.

/// Environment variable overriding the Debian mirror URL.
pub const MIRROR_ENV: &str = "KLOOP_MIRROR";
/// Environment variable overriding the cache root.
pub const CACHE_DIR_ENV: &str = "KLOOP_CACHE_DIR";
/// Environment variable overriding the keyring used to verify Release files.
pub const KEYRING_ENV: &str = "KLOOP_KEYRING";
/// The host keyring used when neither [`FetchOptions::keyring`](crate::FetchOptions::keyring) nor
/// [`KEYRING_ENV`] say otherwise.
pub const DEFAULT_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
