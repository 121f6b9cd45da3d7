//! How a session proves who it is to etcd and checks etcd's identity: TLS (the CA, a
//! client certificate) and an etcd user, from `[cluster]`. Read at every session's start,
//! so that renewed certificates and a changed password take effect at the next session,
//! and by `dispatcher check`.

use std::{os::unix::fs::MetadataExt as _, path::Path};

use anyhow::{bail, Context as _};
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::config::{ClusterSettings, StoreSecurity};

/// The longest password file read.
const MAX_PASSWORD: u64 = 1024;

/// `options` with the TLS settings and the user of `settings`.
pub fn apply(settings: &ClusterSettings, options: ConnectOptions) -> anyhow::Result<ConnectOptions> {
    let StoreSecurity::Tls { ca_file, client_cert, user } = &settings.security else {
        return Ok(options);
    };
    let mut tls = TlsOptions::new();
    tls = match ca_file {
        Some(path) => {
            // Parsed here first, for an error that names the file.
            crate::tls::certs::read_chain(path)?;
            tls.ca_certificate(Certificate::from_pem(read(path)?))
        }
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = client_cert {
        crate::tls::certs::read_chain(cert)?;
        crate::tls::certs::read_key(key)?;
        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    let mut options = options.with_tls(tls);
    if let Some((name, file)) = user {
        options = options.with_user(name.clone(), password(file)?).with_auto_token_refresh(true);
    }
    Ok(options)
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The password in `file`: its first line. The file must be a regular file no one but its
/// owner and group may read.
pub fn password(file: &Path) -> anyhow::Result<String> {
    let meta = std::fs::metadata(file).with_context(|| format!("password file {}", file.display()))?;
    if !meta.is_file() {
        bail!("password file {}: not a regular file", file.display());
    }
    if meta.mode() & 0o007 != 0 {
        bail!(
            "password file {}: readable by every user (mode {:o}): chmod 600 it",
            file.display(),
            meta.mode() & 0o777
        );
    }
    if meta.len() > MAX_PASSWORD {
        bail!("password file {}: longer than {MAX_PASSWORD} bytes", file.display());
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("password file {}", file.display()))?;
    let pw = text.lines().next().unwrap_or("").to_string();
    if pw.is_empty() {
        bail!("password file {}: empty", file.display());
    }
    Ok(pw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_password_file_others_can_read_is_refused() {
        let dir = std::env::temp_dir().join(format!("dsp-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "s3cret\nignored\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(password(&f).unwrap(), "s3cret");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(password(&f).unwrap_err().to_string().contains("readable by every user"));
        std::fs::write(&f, "\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(password(&f).unwrap_err().to_string().contains("empty"));
        assert!(password(&dir).unwrap_err().to_string().contains("not a regular file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
