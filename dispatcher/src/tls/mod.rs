//! TLS, both ways: `server` terminates HTTPS on HTTP VIPs (certificates chosen by SNI,
//! session resumption, handshake limits), `upstream` speaks TLS to backends, `certs`
//! reads and checks PEM files for both and for `dispatcher check`.
//!
//! The crypto provider is aws-lc-rs (rustls' default): on this CPU class (AES-NI, VAES,
//! AVX-512, ADX) its P-256 signatures and AES-GCM are the fastest rustls can use, and it
//! builds with the C compiler alone (no cmake, no Go), which `cargo xtask setup` already
//! has.

pub mod certs;
pub mod server;
pub mod upstream;

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The one crypto provider of the process.
pub fn provider() -> Arc<CryptoProvider> {
    static P: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider())).clone()
}
