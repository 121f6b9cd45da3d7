//! `cargo xtask package`: a Debian package of the agent, built with dpkg-deb from a
//! staged tree: the release binary (XDP programs embedded), the systemd units, an
//! example configuration (a conffile), the manual pages (man/), shell completions
//! generated from the command line's definition, the runtime dependencies of the
//! binary's shared libraries (dpkg-shlibdeps: the packages that hold the libraries the
//! loader would load, at the versions their symbols files give for the symbols it uses),
//! and the md5sums of the files.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::{run_cmd, setup::output as output_of, step, workspace_root};

const NAME: &str = "dispatcher";
/// The manual pages under man/, each in the section its name ends with.
const MAN_PAGES: [&str; 2] = ["dispatcher.8", "dispatcher.toml.5"];
/// The license texts the copyright file carries (the workspace is MIT OR Apache-2.0).
const LICENSE_TEXTS: &str = "\nApache-2.0: on Debian systems, the full text of the Apache License, Version 2.0,\nis in /usr/share/common-licenses/Apache-2.0.\n\nMIT:\n Permission is hereby granted, free of charge, to any person obtaining a copy\n of this software and associated documentation files (the \"Software\"), to deal\n in the Software without restriction, including without limitation the rights\n to use, copy, modify, merge, publish, distribute, sublicense, and/or sell\n copies of the Software, and to permit persons to whom the Software is\n furnished to do so, subject to the following conditions:\n .\n The above copyright notice and this permission notice shall be included in\n all copies or substantial portions of the Software.\n .\n THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR\n IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,\n FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE\n AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER\n LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,\n OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE\n SOFTWARE.\n";

/// What dh_installsystemd would add: systemd told about new units, running instances
/// restarted after an upgrade (they adopt the data plane they left pinned), stopped
/// before removal. Nothing of it when installing into another root (`DPKG_ROOT`) or
/// without systemd running.
const MAINTAINER_SCRIPTS: [(&str, &str); 3] = [
    (
        "postinst",
        "#!/bin/sh\nset -e\nif [ -z \"${DPKG_ROOT:-}\" ] && [ -d /run/systemd/system ]; then\n    systemctl daemon-reload >/dev/null || true\n    if [ \"$1\" = configure ] && [ -n \"$2\" ]; then\n        systemctl try-restart 'dispatcher@*.service' 'dispatcher-decap@*.service' >/dev/null || true\n    fi\nfi\n",
    ),
    (
        "prerm",
        "#!/bin/sh\nset -e\nif [ -z \"${DPKG_ROOT:-}\" ] && [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then\n    systemctl stop 'dispatcher@*.service' 'dispatcher-decap@*.service' >/dev/null || true\nfi\n",
    ),
    (
        "postrm",
        "#!/bin/sh\nset -e\nif [ -z \"${DPKG_ROOT:-}\" ] && [ -d /run/systemd/system ]; then\n    systemctl daemon-reload >/dev/null || true\nfi\n",
    ),
];

/// Configuration files dpkg keeps an administrator's changes to (paths from the root).
const CONFFILES: [&str; 1] = ["etc/dispatcher/example.toml"];

const MAINTAINER: &str = "dispatcher developers <dispatcher-devel@example.org>";

fn write(path: &Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

fn gzip(path: &Path) -> anyhow::Result<()> {
    run_cmd(Command::new("gzip").args(["-9", "-n", "-f"]).arg(path))
}

/// The files under `dir`, every level, as paths relative to it, sorted; `DEBIAN` left out.
fn files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        for entry in
            std::fs::read_dir(dir.join(&rel)).with_context(|| format!("reading {}", dir.join(&rel).display()))?
        {
            let entry = entry?;
            let path = rel.join(entry.file_name());
            let kind = entry.file_type()?;
            if kind.is_dir() && path != Path::new("DEBIAN") {
                dirs.push(path);
            } else if kind.is_file() {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// `Depends:` for the ELF files of the staged tree, from dpkg-shlibdeps: for each library
/// a binary needs, the file the dynamic loader would load (this architecture's, by its
/// real path: not a same-named library of another architecture, such as libc6-i386's
/// /lib32/libm.so.6), the package that holds it, and a version floor from that package's
/// symbols file (the newest symbol the binaries use). dpkg-shlibdeps reads a source
/// package's debian/control: a minimal one is written in a scratch folder of `out`.
fn depends(stage: &Path, out: &Path) -> anyhow::Result<String> {
    let mut elves = Vec::new();
    for file in files(stage)? {
        let path = stage.join(&file);
        let mut magic = [0u8; 4];
        let is_elf = std::fs::File::open(&path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok()
            && magic == *b"\x7fELF";
        if is_elf {
            elves.push(path);
        }
    }
    if elves.is_empty() {
        bail!("no ELF binary under {}", stage.display());
    }
    let scratch = out.join("shlibdeps");
    let _ = std::fs::remove_dir_all(&scratch);
    write(&scratch.join("debian/control"), format!("Source: {NAME}\n\nPackage: {NAME}\nArchitecture: amd64\n"))?;
    let mut cmd = Command::new("dpkg-shlibdeps");
    // -O: the substitution variables on standard output; -e<binary> in one word, as its
    // manual writes it (`-e <binary>` draws a warning of a binary outside its package).
    cmd.arg("-O").args(elves.iter().map(|e| format!("-e{}", e.display()))).current_dir(&scratch);
    let result = output_of(&mut cmd);
    std::fs::remove_dir_all(&scratch)?;
    let vars = result?;
    let depends = vars
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .with_context(|| format!("dpkg-shlibdeps printed no shlibs:Depends: {vars}"))?
        .trim()
        .to_string();
    if !depends.split(',').any(|d| d.trim().starts_with("libc6 ")) {
        bail!("dpkg-shlibdeps found no versioned libc6 dependency: {depends}");
    }
    Ok(depends)
}

/// DEBIAN/md5sums: `<md5>  <path>` for every file of the staged tree (the path from the
/// root, no leading slash), as dpkg installs it to /var/lib/dpkg/info for `dpkg --verify`
/// and debsums. Conffiles are left out, as dh_md5sums leaves them: dpkg records their
/// digests in its status, to tell an administrator's change from the package's.
fn md5sums(stage: &Path) -> anyhow::Result<String> {
    let shipped: Vec<PathBuf> =
        files(stage)?.into_iter().filter(|f| !CONFFILES.iter().any(|c| f == Path::new(c))).collect();
    let sums = output_of(Command::new("md5sum").arg("--").args(&shipped).current_dir(stage))?;
    // md5sum escapes a name with a backslash or a newline (`\<md5>  ...`): dpkg would not read it.
    if let Some(line) = sums.lines().find(|l| l.starts_with('\\')) {
        bail!("a file name md5sums cannot hold: {line}");
    }
    Ok(sums)
}

/// Builds the package under `out` (default `target/package`); returns its path.
pub fn package(out: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let binary = target.join("release").join(NAME);
    let version = format!("{}-1", env!("CARGO_PKG_VERSION"));
    // Absolute: dpkg-shlibdeps runs in a folder of its own and is given the binaries' paths.
    let out = std::path::absolute(out.unwrap_or_else(|| target.join("package")))?;
    let stage = out.join(format!("{NAME}_{version}_amd64"));
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    step(&format!("staging {}", stage.display()));
    let sbin = stage.join("usr/sbin").join(NAME);
    std::fs::create_dir_all(sbin.parent().unwrap())?;
    std::fs::copy(&binary, &sbin).with_context(|| format!("copying {}", binary.display()))?;
    run_cmd(
        Command::new("strip")
            .args(["--strip-unneeded", "--remove-section=.comment", "--remove-section=.note"])
            .arg(&sbin),
    )?;
    for unit in ["dispatcher@.service", "dispatcher-decap@.service"] {
        let text = std::fs::read(root.join("packaging/systemd").join(unit))?;
        write(&stage.join("lib/systemd/system").join(unit), text)?;
    }
    write(&stage.join("etc/dispatcher/example.toml"), std::fs::read(root.join("packaging/example.toml"))?)?;
    // The manual pages, as written (man/, checked against the command line and the
    // configuration parser by tests/tests/man_pages.rs).
    for page in MAN_PAGES {
        let section = page.rsplit('.').next().unwrap();
        let to = stage.join(format!("usr/share/man/man{section}")).join(page);
        write(&to, std::fs::read(root.join("man").join(page))?)?;
        gzip(&to)?;
    }
    // The completions, from the binary's own command line.
    let completions = out.join("completions");
    let _ = std::fs::remove_dir_all(&completions);
    run_cmd(Command::new(&binary).arg("generate-completions").arg("--out").arg(&completions))?;
    for (from, to) in [
        ("dispatcher.bash", "usr/share/bash-completion/completions/dispatcher"),
        ("_dispatcher", "usr/share/zsh/vendor-completions/_dispatcher"),
        ("dispatcher.fish", "usr/share/fish/vendor_completions.d/dispatcher.fish"),
    ] {
        write(&stage.join(to), std::fs::read(completions.join(from))?)?;
    }
    let doc = stage.join("usr/share/doc").join(NAME);
    write(
        &doc.join("copyright"),
        format!(
            "{NAME}\n\nCopyright (C) 2026 the {NAME} developers\n\nLicense: {}\n{}",
            env!("CARGO_PKG_LICENSE"),
            LICENSE_TEXTS
        ),
    )?;
    let date = output_of(Command::new("date").arg("-R"))?;
    write(
        &doc.join("changelog.Debian"),
        format!("{NAME} ({version}) unstable; urgency=medium\n\n  * Package built by cargo xtask package.\n\n -- {MAINTAINER}  {}\n", date.trim()),
    )?;
    gzip(&doc.join("changelog.Debian"))?;
    // Control files. DEBIAN first: dpkg-shlibdeps knows the package's tree by it.
    std::fs::create_dir_all(stage.join("DEBIAN"))?;
    let depends = depends(&stage, &out)?;
    let installed_kib = output_of(Command::new("du").args(["-sk", "--exclude=DEBIAN"]).arg(&stage))?;
    let installed_kib = installed_kib.split_whitespace().next().unwrap_or("0").to_string();
    let control = format!(
        "Package: {NAME}\nVersion: {version}\nArchitecture: amd64\nMaintainer: {MAINTAINER}\nInstalled-Size: {installed_kib}\nDepends: {}\nSection: net\nPriority: optional\nDescription: XDP-assisted L4 and HTTP dispatcher with session affinity\n An XDP program forwards L4 flows (consistent hashing, MAC forwarding or IPIP)\n and routes SIP by logical name; an agent proxies HTTP/1.1 and HTTPS with\n JSESSIONID affinity, holds requests while a session's owner is unknown, and\n fails sessions over to the owner's peer replica.\n",
        depends
    );
    write(&stage.join("DEBIAN/control"), control)?;
    write(&stage.join("DEBIAN/conffiles"), CONFFILES.map(|c| format!("/{c}\n")).concat())?;
    for (script, text) in MAINTAINER_SCRIPTS {
        write(&stage.join("DEBIAN").join(script), text)?;
    }
    write(&stage.join("DEBIAN/md5sums"), md5sums(&stage)?)?;
    // Permissions as a package has them, whatever the umask of the build.
    run_cmd(Command::new("chmod").args(["-R", "u=rwX,go=rX"]).arg(&stage))?;
    run_cmd(Command::new("chmod").arg("0755").arg(&sbin))?;
    for (script, _) in MAINTAINER_SCRIPTS {
        run_cmd(Command::new("chmod").arg("0755").arg(stage.join("DEBIAN").join(script)))?;
    }
    let deb = out.join(format!("{NAME}_{version}_amd64.deb"));
    step(&format!("dpkg-deb --build {}", deb.display()));
    run_cmd(Command::new("dpkg-deb").args(["--build", "--root-owner-group"]).arg(&stage).arg(&deb))?;
    if !deb.exists() {
        bail!("dpkg-deb wrote no {}", deb.display());
    }
    println!("{}", deb.display());
    Ok(deb)
}
