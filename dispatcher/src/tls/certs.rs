//! Certificate chains and keys from PEM files: the chain must parse, the key must be the
//! leaf's, and the leaf's names and expiry are read for SNI, status and `check`.

use std::{path::Path, sync::Arc, time::SystemTime};

use anyhow::{anyhow, bail, Context};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    sign::CertifiedKey,
};
use x509_parser::prelude::*;

use crate::config::CertFiles;

/// What status, metrics and `check` show of a certificate.
#[derive(Clone, Debug)]
pub struct CertInfo {
    pub file: String,
    pub subject: String,
    /// The SNI names it answers (lower case; `*.` for a wildcard).
    pub names: Vec<String>,
    /// End of validity, seconds since the epoch.
    pub not_after: i64,
}

impl CertInfo {
    /// Seconds left before it expires (negative: expired).
    pub fn seconds_left(&self) -> i64 {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        self.not_after - now
    }
}

pub struct Loaded {
    pub key: Arc<CertifiedKey>,
    pub info: CertInfo,
}

/// A file that is not there, said so (not as a PEM parse error).
fn exists(path: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("{}: no such file", path.display()),
        Err(e) => bail!("{}: cannot read: {e}", path.display()),
        Ok(_) => Ok(()),
    }
}

/// Reads a PEM certificate chain (leaf first).
pub fn read_chain(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let file = path.display();
    exists(path)?;
    let chain = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {file}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{file}: not a PEM certificate chain: {e}"))?;
    if chain.is_empty() {
        bail!("{file}: no CERTIFICATE block");
    }
    Ok(chain)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    exists(path)?;
    PrivateKeyDer::from_pem_file(path).map_err(|e| anyhow!("{}: no usable PEM private key: {e}", path.display()))
}

/// Loads a chain and its key; refuses a chain that does not parse, a chain whose
/// certificates do not follow each other (each one issued by the next), and a key that
/// is not the leaf's.
pub fn load(files: &CertFiles) -> anyhow::Result<Loaded> {
    let cert_file = files.cert.display().to_string();
    let chain = read_chain(&files.cert)?;
    let mut leaf: Option<(String, Vec<String>, i64)> = None;
    let mut previous_issuer: Option<String> = None;
    for (i, der) in chain.iter().enumerate() {
        let (_, c) = X509Certificate::from_der(der)
            .map_err(|e| anyhow!("{cert_file}: certificate {} of the chain does not parse: {e}", i + 1))?;
        let subject = c.subject().to_string();
        if let Some(issuer) = previous_issuer.take() {
            if issuer != subject {
                bail!(
                    "{cert_file}: certificate {} ({subject}) did not issue certificate {} (issued by {issuer}): the chain must go from the leaf up",
                    i + 1,
                    i
                );
            }
        }
        previous_issuer = Some(c.issuer().to_string());
        if i == 0 {
            let mut names: Vec<String> = match c.subject_alternative_name() {
                Ok(Some(san)) => san
                    .value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            if names.is_empty() {
                names.extend(
                    c.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_ascii_lowercase),
                );
            }
            leaf = Some((subject, names, c.validity().not_after.timestamp()));
        }
    }
    let (subject, cert_names, not_after) = leaf.expect("a non-empty chain has a leaf");
    let key = read_key(&files.key)?;
    let signing = super::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| anyhow!("{}: the key cannot sign: {e}", files.key.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        anyhow!("{}: the key does not belong to the certificate in {cert_file} ({e})", files.key.display())
    })?;
    let names = if files.names.is_empty() { cert_names } else { files.names.clone() };
    Ok(Loaded { key: Arc::new(certified), info: CertInfo { file: cert_file, subject, names, not_after } })
}

/// What `check` says of a certificate that loads: nothing, or that it expires soon or
/// has expired.
pub fn expiry_warning(info: &CertInfo, within_days: i64) -> Option<String> {
    let left = info.seconds_left();
    if left <= 0 {
        Some(format!("{}: certificate {} EXPIRED {} days ago", info.file, info.subject, -left / 86_400))
    } else if left < within_days * 86_400 {
        Some(format!("{}: certificate {} expires in {} days", info.file, info.subject, left / 86_400))
    } else {
        None
    }
}
