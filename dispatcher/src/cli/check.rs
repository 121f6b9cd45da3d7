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
    for (i, v, h) in cfg.vips.iter().enumerate().filter_map(|(i, v)| Some((i, v, v.served_http()?))) {
        for (j, files) in h.tls.iter().flat_map(|t| &t.certificates).enumerate() {
            // Where the file that failed is named: its `cert =` or `key =` line.
            let at = |e: &str| {
                let key = e.starts_with(&files.key.display().to_string());
                let (field, line) = if key { ("key", files.lines[1]) } else { ("cert", files.lines[0]) };
                format!("{}:{line}: vip[{i}].tls.certificate[{j}].{field}: VIP {}", file.display(), v.name)
            };
            match tls::certs::load(files) {
                Ok(loaded) => {
                    if let Some(w) = tls::certs::expiry_warning(&loaded.info, EXPIRY_WARNING_DAYS) {
                        eprintln!("warning: {}: {w}", at(""));
                    }
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    eprintln!("{}: {e}", at(&e));
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
