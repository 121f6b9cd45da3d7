//! Certificates for the TLS tests, made by the real `openssl` command (ECDSA P-256), and
//! the real TLS clients the tests drive: curl and `openssl s_client`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

use crate::{
    netns::{Ns, Testbed},
    websphere,
};

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

/// The address of `https_testbed`'s VIP, and its clones' port.
pub const HTTPS_VIP: &str = "10.99.100.8";
pub const HTTPS_BACKEND_PORT: u16 = 8080;

/// An HTTPS VIP in front of WebSphere-like clones (`https_testbed`).
pub struct HttpsBed {
    pub tb: Testbed,
    pub cluster: Arc<websphere::Clones>,
    pub pki: Pki,
    /// The configuration file.
    pub cfg: String,
}

/// `n` clones in replica pairs behind an HTTPS VIP `shop` on `HTTPS_VIP`:443. `pki_setup`
/// makes the certificates and returns the `[vip.tls]` lines (without the section header)
/// and more configuration after them (more VIPs); `http`: lines for `[http]`.
pub fn https_testbed(n: usize, pki_setup: impl FnOnce(&Pki) -> (String, String), http: &str) -> HttpsBed {
    https_testbed_with(n, pki_setup, http, |_| {})
}

/// As `https_testbed`; `prepare` runs before the agent starts (more servers on the
/// backends, files the configuration names).
pub fn https_testbed_with(
    n: usize,
    pki_setup: impl FnOnce(&Pki) -> (String, String),
    http: &str,
    prepare: impl FnOnce(&mut Testbed),
) -> HttpsBed {
    let (vip, port) = (HTTPS_VIP, HTTPS_BACKEND_PORT);
    let mut tb = Testbed::new(n, &[vip]);
    tb.add_local_vip(vip);
    let cluster = websphere::Clones::new(n);
    tb.start_websphere(&cluster, port);
    let pki = Pki::new(&tb.workdir);
    let (tls, more) = pki_setup(&pki);
    prepare(&mut tb);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n[http]\nheader_timeout = \"1s\"\n{http}\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n\n{}\n[[vip]]\nname = \"shop\"\naddress = \"{vip}\"\nport = 443\nmode = \"http\"\nbackend_port = {port}\n[vip.tls]\n{tls}\n{more}",
        tb.instance(),
        tb.backend_config(&[])
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    HttpsBed { tb, cluster, pki, cfg: path.display().to_string() }
}

/// One certificate for shop.example (the default), a 500 ms handshake deadline: the
/// `[vip.tls]` lines, nothing more.
pub fn shop_only(pki: &Pki) -> (String, String) {
    let (cert, key) = pki.leaf("ca", "shop", "shop.example", &["shop.example"], 20);
    (format!("handshake_timeout = \"500ms\"\n{}", certificate_entry(&cert, &key, &[])), String::new())
}
