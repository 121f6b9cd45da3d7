use std::{path::Path, process::ExitCode};

use dispatcher::{config::Config, tls};

/// Days before expiry from which `check` warns about a certificate.
const EXPIRY_WARNING_DAYS: i64 = 30;

pub fn check(file: &Path) -> anyhow::Result<ExitCode> {
    let cfg = match Config::load(file) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(1));
        }
    };
    // What the file says that can never take effect (a route no request can reach) or is
    // not used (plugin-cfg.xml attributes): warnings, by name and line; never a refusal.
    for w in &cfg.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(w) = super::config_file::instance_mismatch(file, &cfg) {
        eprintln!("warning: {w}");
    }
    // The TLS files: chains that parse, keys that match, expiry.
    let mut errors = 0;
    for (v, h) in cfg.vips.iter().filter_map(|v| Some((v, v.served_http()?))) {
        for files in h.tls.iter().flat_map(|t| &t.certificates) {
            match tls::certs::load(files) {
                Ok(loaded) => {
                    if let Some(w) = tls::certs::expiry_warning(&loaded.info, EXPIRY_WARNING_DAYS) {
                        eprintln!("warning: VIP {}: {w}", v.name);
                    }
                }
                Err(e) => {
                    eprintln!("VIP {}: {e:#}", v.name);
                    errors += 1;
                }
            }
        }
        if let Some(f) = &h.backend_tls {
            if let Err(e) = tls::upstream::client_config(f) {
                eprintln!("VIP {}: backend_tls: {e:#}", v.name);
                errors += 1;
            }
        }
    }
    if let Some(c) = &cfg.cluster {
        // The TLS files and the password file, read as a session reads them.
        if let Err(e) = dispatcher::shared::credentials::apply(c, etcd_client::ConnectOptions::new()) {
            eprintln!("[cluster]: {e:#}");
            errors += 1;
        }
        if c.security.insecure() {
            eprintln!("warning: [cluster]: {}", c.security.describe());
        }
    }
    if errors > 0 {
        return Ok(ExitCode::from(1));
    }
    println!("{}: ok ({} VIPs, {} backends)", file.display(), cfg.vips.len(), cfg.backends.len());
    Ok(ExitCode::SUCCESS)
}
