//! Certificates for the TLS tests, made by the real `openssl` command (ECDSA P-256), and
//! the real TLS clients the tests drive: curl and `openssl s_client`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::netns::Ns;

/// A folder of CAs and certificates.
pub struct Pki {
    pub dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("running openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Pki {
    /// A folder under `parent` with one CA, `ca`.
    pub fn new(parent: &Path) -> Pki {
        let dir = parent.join("pki");
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        pki.ca("ca");
        pki
    }

    fn key(&self, name: &str) -> String {
        let key = format!("{name}.key");
        openssl(&self.dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", &key]);
        key
    }

    /// A self-signed CA, `<name>.pem` and `<name>.key`.
    pub fn ca(&self, name: &str) -> PathBuf {
        let key = self.key(name);
        let pem = format!("{name}.pem");
        let subj = format!("/CN=Test CA {name}");
        openssl(&self.dir, &["req", "-x509", "-new", "-key", &key, "-subj", &subj, "-days", "30", "-out", &pem]);
        self.dir.join(pem)
    }

    /// A leaf certificate for `cn` with the DNS names `sans` (and IP addresses written as
    /// `IP:a.b.c.d`), signed by CA `ca`, valid `days`: (certificate, key). `file` names them.
    pub fn leaf(&self, ca: &str, file: &str, cn: &str, sans: &[&str], days: u32) -> (PathBuf, PathBuf) {
        let key = self.key(file);
        let csr = format!("{file}.csr");
        openssl(&self.dir, &["req", "-new", "-key", &key, "-subj", &format!("/CN={cn}"), "-out", &csr]);
        let alt: Vec<String> =
            sans.iter().map(|s| if s.starts_with("IP:") { s.to_string() } else { format!("DNS:{s}") }).collect();
        let ext = format!("{file}.ext");
        std::fs::write(
            self.dir.join(&ext),
            format!("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={}\n", alt.join(",")),
        )
        .unwrap();
        let pem = format!("{file}.pem");
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                &days.to_string(),
                "-extfile",
                &ext,
                "-out",
                &pem,
            ],
        );
        (self.dir.join(pem), self.dir.join(key))
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

/// A TOML `[[vip.tls.certificate]]` entry.
pub fn certificate_entry(cert: &Path, key: &Path, names: &[&str]) -> String {
    let names = if names.is_empty() {
        String::new()
    } else {
        format!("names = [{}]\n", names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", "))
    };
    format!("[[vip.tls.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n{names}", cert.display(), key.display())
}

/// What a command printed, and whether it succeeded.
pub struct Ran {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(ns: &Ns, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Ran {
    use std::io::Write;
    let mut cmd = ns.command(program);
    cmd.args(args).stdin(std::process::Stdio::piped());
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("starting {program}: {e}"));
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        let _ = input.write_all(bytes);
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    Ran {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `openssl s_client` to `addr` (`ip:port`) with `extra` options, sending `input`; the
/// whole transcript (stdout and stderr).
pub fn s_client(ns: &Ns, addr: &str, extra: &[&str], input: &[u8]) -> String {
    let mut args = vec!["s_client", "-connect", addr];
    args.extend_from_slice(extra);
    let r = run(ns, "openssl", &args, Some(input));
    format!("{}\n{}", r.stdout, r.stderr)
}
