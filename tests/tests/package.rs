//! `cargo xtask package`: the Debian package builds, holds what an operator expects,
//! depends on the packages of the libraries its binary loads (and on no other), carries
//! the md5sums of its files, passes lintian without errors, installs into a throwaway
//! root with dpkg (its own database), and its systemd units pass `systemd-analyze verify`
//! there. And the agent's unit lets it write wherever the documentation tells an
//! operator to have it write (its sandbox makes the rest of the system read-only).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A folder of this test's, removed when the test ends (even when it fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_debian_package_builds_installs_and_its_units_verify() {
    let scratch = Scratch(workspace().join("target/tmp").join(format!("package-test-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).unwrap();
    let out = scratch.0.join("out");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let (ok, stdout, stderr) =
        run(Command::new(cargo).current_dir(workspace()).args(["xtask", "package", "--out"]).arg(&out));
    assert!(ok, "cargo xtask package failed:\n{stderr}");
    let deb = PathBuf::from(stdout.lines().last().unwrap().trim());
    assert!(deb.starts_with(&out) && deb.extension().is_some_and(|e| e == "deb"), "{stdout}");

    // What it holds.
    let (ok, listing, _) = run(Command::new("dpkg").arg("-c").arg(&deb));
    assert!(ok);
    for path in [
        "./usr/sbin/dispatcher",
        "./lib/systemd/system/dispatcher@.service",
        "./lib/systemd/system/dispatcher-decap@.service",
        "./etc/dispatcher/example.toml",
        "./usr/share/man/man8/dispatcher.8.gz",
        "./usr/share/man/man5/dispatcher.toml.5.gz",
        "./usr/share/bash-completion/completions/dispatcher",
        "./usr/share/zsh/vendor-completions/_dispatcher",
        "./usr/share/fish/vendor_completions.d/dispatcher.fish",
        "./usr/share/doc/dispatcher/copyright",
    ] {
        assert!(listing.lines().any(|l| l.ends_with(path)), "{path} missing:\n{listing}");
    }
    assert!(!listing.contains("generate-"), "{listing}");
    // The written pages, not one generated per subcommand.
    let pages: Vec<&str> = listing.lines().filter(|l| l.contains("/usr/share/man/") && l.ends_with(".gz")).collect();
    assert_eq!(pages.len(), 2, "{pages:?}");
    let (_, depends, _) = run(Command::new("dpkg-deb").args(["-f"]).arg(&deb).arg("Depends"));
    let depends = depends.trim();
    assert!(depends.contains("libc6 (>= 2."), "{depends}");

    // apt accepts it as a local package and resolves its dependencies on this machine
    // (simulated: this machine's own packages are not changed).
    let (ok, plan, err) = run(Command::new("apt-get").args(["install", "-s", "-y"]).arg(&deb));
    assert!(ok && plan.lines().any(|l| l.starts_with("Inst dispatcher ")), "apt-get install -s: {plan}{err}");

    // lintian: no errors (its warnings are printed), and nothing at all about the manual
    // pages (informational tags included).
    let (_, lint, lint_err) = run(Command::new("lintian").args(["--display-info", "--pedantic"]).arg(&deb));
    eprintln!("lintian:\n{lint}{lint_err}");
    assert!(!lint.lines().any(|l| l.starts_with("E:")), "lintian errors:\n{lint}");
    let about_pages: Vec<&str> =
        lint.lines().filter(|l| l.contains("usr/share/man/") || l.contains("manpage")).collect();
    assert!(about_pages.is_empty(), "lintian on the manual pages:\n{}", about_pages.join("\n"));

    // Installed into a throwaway root with a dpkg database of its own (the root has no
    // libc6 package: dependencies are not checked there).
    let root = scratch.0.join("root");
    let admin = root.join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("updates")).unwrap();
    std::fs::create_dir_all(admin.join("info")).unwrap();
    std::fs::write(admin.join("status"), "").unwrap();
    let (ok, _, err) = run(Command::new("dpkg")
        .args(["--force-not-root", "--force-depends", "--force-script-chrootless"])
        .arg(format!("--instdir={}", root.display()))
        .arg(format!("--admindir={}", admin.display()))
        .arg("-i")
        .arg(&deb));
    assert!(ok, "dpkg -i into {}: {err}", root.display());
    let (_, status, _) =
        run(Command::new("dpkg").arg(format!("--admindir={}", admin.display())).args(["-s", "dispatcher"]));
    assert!(status.contains("Status: install ok installed"), "{status}");
    assert!(status.contains("Conffiles:\n /etc/dispatcher/example.toml"), "{status}");
    let bin = root.join("usr/sbin/dispatcher");
    depends_cover_exactly_what_the_loader_loads(depends, &bin);
    md5sums_cover_every_file(&deb, &listing, &root, &admin, &scratch.0);
    let (ok, version, _) = run(Command::new(&bin).arg("--version"));
    assert!(ok && version.starts_with("dispatcher "), "{version}");
    let (ok, checked, err) = run(Command::new(&bin).arg("check").arg(root.join("etc/dispatcher/example.toml")));
    assert!(ok, "the example configuration validates: {checked}{err}");
    let (ok, page, _) = run(Command::new("sh")
        .arg("-c")
        .arg(format!("zcat {} | grep -c keep", root.join("usr/share/man/man8/dispatcher.8.gz").display())));
    assert!(ok && page.trim() != "0", "the page documents --keep-dataplane");

    // The units, as systemd reads them: verified offline in the root (the host's own
    // units copied beside them, for the targets they name). Any message is a failure.
    let units = root.join("lib/systemd/system");
    run(Command::new("cp").arg("-rn").arg("/lib/systemd/system/.").arg(&units));
    for (template, instance) in [
        ("dispatcher@.service", "dispatcher@example.service"),
        ("dispatcher-decap@.service", "dispatcher-decap@eth0.service"),
    ] {
        std::fs::copy(units.join(template), units.join(instance)).unwrap();
        let (ok, out, err) = run(Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(format!("--root={}", root.display()))
            .arg(units.join(instance)));
        assert!(ok && out.trim().is_empty() && err.trim().is_empty(), "{instance}: {out}{err}");
    }
    // A broken unit is refused by the same check (so the check can fail).
    let unit = std::fs::read_to_string(units.join("dispatcher@.service")).unwrap();
    std::fs::write(units.join("dispatcher@broken.service"), unit.replace("Type=notify", "Type=notified")).unwrap();
    let (_, out, err) = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.display()))
        .arg(units.join("dispatcher@broken.service")));
    assert!(!(out + &err).trim().is_empty(), "a bad Type= goes unnoticed");
}

/// The package names a Depends field lists (alternatives too), without versions.
fn depends_names(depends: &str) -> BTreeSet<String> {
    depends
        .split([',', '|'])
        .filter_map(|d| d.split_whitespace().next())
        .map(|name| name.split('(').next().unwrap().to_string())
        .collect()
}

/// The package that holds `path`, a library as the dynamic loader resolves it: dpkg
/// registers a file under one of its names (the path itself, or where its symlinks lead;
/// with merged /usr, /lib/x is /usr/lib/x), so each is asked exactly, never by pattern
/// (a pattern finds the other architectures' copies too: /lib32/libm.so.6).
fn owner_of(path: &str) -> Option<String> {
    let mut names = vec![path.to_string()];
    if let Ok(real) = std::fs::canonicalize(path) {
        names.push(real.to_string_lossy().into_owned());
    }
    for name in names.clone() {
        names.push(match name.strip_prefix("/usr") {
            Some(rest) => rest.to_string(),
            None => format!("/usr{name}"),
        });
    }
    names.iter().find_map(|name| {
        let (ok, out, _) = run(Command::new("dpkg").arg("-S").arg(name));
        let line = out.lines().find(|l| ok && !l.starts_with("diversion by "))?;
        let (packages, _) = line.rsplit_once(": ")?;
        // `libc6:amd64`: the architecture qualifier is not part of a dependency on a
        // package of the same architecture.
        Some(packages.split(", ").next()?.split(':').next()?.to_string())
    })
}

/// Depends names exactly the packages of the shared libraries `binary` needs, as the
/// loader finds them on this machine (ldd), none of another architecture's (an i386
/// libc6-i386 also has a libm.so.6), and libc6 at least at the newest GLIBC_ symbol
/// version the binary references.
fn depends_cover_exactly_what_the_loader_loads(depends: &str, binary: &Path) {
    let names = depends_names(depends);
    for name in &names {
        assert!(
            !(name.contains(':')
                || name.ends_with("-i386")
                || name.ends_with("-amd64")
                || name.ends_with("-x32")
                || name.starts_with("lib32")
                || name.starts_with("libx32")
                || name.starts_with("lib64")),
            "Depends names {name}, a package of another architecture's libraries: {depends}"
        );
    }
    let (ok, dynamic, err) = run(Command::new("objdump").arg("-p").arg(binary));
    assert!(ok, "objdump -p: {err}");
    let needed: Vec<&str> = dynamic.lines().filter_map(|l| l.trim().strip_prefix("NEEDED")).map(str::trim).collect();
    assert!(needed.contains(&"libc.so.6"), "{dynamic}");
    let (ok, loaded, err) = run(Command::new("ldd").arg(binary));
    assert!(ok, "ldd: {err}");
    let mut owners = BTreeSet::new();
    for lib in &needed {
        // `libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)`, or the interpreter's
        // own line, `/lib64/ld-linux-x86-64.so.2 (0x...)`.
        let path = loaded
            .lines()
            .find_map(|l| {
                let l = l.trim();
                match l.split_once(" => ") {
                    Some((name, to)) if name == *lib => to.split_whitespace().next(),
                    None if l.split_whitespace().next()?.rsplit('/').next() == Some(*lib) => {
                        l.split_whitespace().next()
                    }
                    _ => None,
                }
            })
            .unwrap_or_else(|| panic!("ldd does not resolve {lib}:\n{loaded}"));
        assert!(path.starts_with('/'), "{lib} => {path}:\n{loaded}");
        let owner = owner_of(path).unwrap_or_else(|| panic!("no package holds {path} ({lib})"));
        assert!(names.contains(&owner), "{lib} is {path}, in {owner}, which Depends does not name: {depends}");
        owners.insert(owner);
    }
    assert_eq!(names, owners, "Depends names packages the binary loads nothing from: {depends}");

    // libc6's version floor: at least the newest GLIBC_x.y the binary references.
    let (ok, symbols, _) = run(Command::new("objdump").arg("-T").arg(binary));
    assert!(ok);
    let newest = symbols
        .split_whitespace()
        .filter_map(|w| w.trim_matches(|c| c == '(' || c == ')').strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max()
        .expect("no GLIBC_ symbol version");
    let floor = depends
        .split(',')
        .find_map(|d| d.trim().strip_prefix("libc6 (>= ")?.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no libc6 (>= ...) in {depends}"));
    let (ge, _, _) =
        run(Command::new("dpkg").args(["--compare-versions", floor, "ge"]).arg(format!("{}.{}", newest.0, newest.1)));
    assert!(ge, "libc6 (>= {floor}) but the binary uses GLIBC_{}.{}", newest.0, newest.1);
}

/// DEBIAN/md5sums lists every regular file the package ships but its conffiles (dpkg
/// records theirs in its status; dh_md5sums leaves them out the same way), by its path
/// from the root without a leading slash, and the installed files match it: with
/// `md5sum -c` in the root, and with `dpkg --verify` (which reads what dpkg installed).
fn md5sums_cover_every_file(deb: &Path, listing: &str, root: &Path, admin: &Path, scratch: &Path) {
    let control = scratch.join("control");
    let (ok, _, err) = run(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control));
    assert!(ok, "dpkg-deb -e: {err}");
    let md5sums = std::fs::read_to_string(control.join("md5sums")).expect("the package has no DEBIAN/md5sums");
    let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap_or_default();
    let conffiles: BTreeSet<&str> = conffiles.lines().map(|l| l.trim_start_matches('/')).collect();
    let listed: BTreeSet<&str> = md5sums
        .lines()
        .map(|l| {
            let (sum, path) = l.split_once("  ").unwrap_or_else(|| panic!("md5sums line `{l}`"));
            assert!(sum.len() == 32 && sum.bytes().all(|b| b.is_ascii_hexdigit()), "md5sums line `{l}`");
            assert!(!path.starts_with('/') && !path.starts_with("./"), "md5sums path `{path}`");
            path
        })
        .collect();
    // `-rw-r--r-- root/root 1234 2026-01-01 00:00 ./usr/sbin/dispatcher`: regular files.
    let shipped: BTreeSet<&str> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().nth(5)?.strip_prefix("./"))
        .filter(|p| !conffiles.contains(p))
        .collect();
    assert!(shipped.contains("usr/sbin/dispatcher"), "{listing}");
    assert_eq!(listed, shipped, "md5sums against the package's files");
    let (ok, out, err) =
        run(Command::new("md5sum").args(["-c", "--strict", "--quiet"]).arg(control.join("md5sums")).current_dir(root));
    assert!(ok, "md5sum -c in the installed root: {out}{err}");
    let (ok, out, err) = run(Command::new("dpkg")
        .arg(format!("--instdir={}", root.display()))
        .arg(format!("--admindir={}", admin.display()))
        .args(["--verify", "dispatcher"]));
    assert!(ok && out.trim().is_empty(), "dpkg --verify: {out}{err}");
}

/// What a unit's sandbox lets its service do with a path, as systemd.exec(5) describes
/// the settings the unit uses (`%i` is the instance's name).
struct Sandbox {
    /// ProtectSystem=: `strict` (everything read-only but the API file systems), `full`
    /// (/usr, /boot, /efi, /etc), `yes` (/usr, /boot, /efi), or none.
    read_only: Vec<PathBuf>,
    strict: bool,
    /// ReadWritePaths=, and the folders RuntimeDirectory=, StateDirectory=,
    /// CacheDirectory= and LogsDirectory= create (and make writable) under /run,
    /// /var/lib, /var/cache and /var/log.
    writable: Vec<PathBuf>,
    /// ProtectHome=yes (/home, /root, /run/user) and InaccessiblePaths=.
    hidden: Vec<PathBuf>,
    /// PrivateTmp=: /tmp and /var/tmp are the service's own, seen by nobody else.
    private: Vec<PathBuf>,
}

impl Sandbox {
    fn of(unit: &str, instance: &str) -> Sandbox {
        let mut s = Sandbox {
            read_only: Vec::new(),
            strict: false,
            writable: Vec::new(),
            hidden: Vec::new(),
            private: Vec::new(),
        };
        let mut section = "";
        for line in unit.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line;
                continue;
            }
            let Some((key, value)) = line.split_once('=') else { continue };
            if section != "[Service]" || line.starts_with('#') {
                continue;
            }
            let value = value.trim().replace("%i", instance).replace("%I", instance);
            let paths = |under: &str| -> Vec<PathBuf> {
                value.split_whitespace().map(|p| Path::new(under).join(p.trim_start_matches(['-', '+']))).collect()
            };
            let yes = ["yes", "true", "on", "1"].contains(&value.as_str());
            match key.trim() {
                "ProtectSystem" => match value.as_str() {
                    "strict" => s.strict = true,
                    "full" => s.read_only.extend(["/usr", "/boot", "/efi", "/etc"].map(PathBuf::from)),
                    _ if yes => s.read_only.extend(["/usr", "/boot", "/efi"].map(PathBuf::from)),
                    _ => {}
                },
                "ReadWritePaths" => s.writable.extend(paths("/")),
                "RuntimeDirectory" => s.writable.extend(paths("/run")),
                "StateDirectory" => s.writable.extend(paths("/var/lib")),
                "CacheDirectory" => s.writable.extend(paths("/var/cache")),
                "LogsDirectory" => s.writable.extend(paths("/var/log")),
                "ReadOnlyPaths" => s.read_only.extend(paths("/")),
                "InaccessiblePaths" => s.hidden.extend(paths("/")),
                "ProtectHome" if yes => s.hidden.extend(["/home", "/root", "/run/user"].map(PathBuf::from)),
                "ProtectHome" if value == "read-only" => {
                    s.read_only.extend(["/home", "/root", "/run/user"].map(PathBuf::from))
                }
                "PrivateTmp" if yes => s.private.extend(["/tmp", "/var/tmp"].map(PathBuf::from)),
                _ => {}
            }
        }
        s
    }

    /// Why the service could not write `path` where an operator would look for it.
    fn cannot_write(&self, path: &Path) -> Option<&'static str> {
        let under = |dirs: &[PathBuf]| dirs.iter().any(|d| path.starts_with(d));
        if under(&self.hidden) {
            Some("inaccessible to the service")
        } else if under(&self.private) {
            Some("in the service's private /tmp, which nobody else sees")
        } else if under(&self.writable) {
            None
        } else if self.strict || under(&self.read_only) {
            Some("read-only to the service")
        } else {
            None
        }
    }
}

/// The paths `doc` tells an operator the agent writes: in its TOML examples the values
/// of the settings that name one (`[access_log] path`, `admin_socket`, `bpffs`), and in
/// its prose the files and folders of the agent's own under /run, /var and /srv (a path
/// component named dispatcher...: /run/dispatcher/<instance>.sock, not /run/netns or
/// etcd's /var/lib/etcd). `<instance>` stands for `instance`.
fn written_paths(doc: &str, instance: &str, whole_file_is_toml: bool) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_toml = whole_file_is_toml;
    let mut table = String::new();
    for line in doc.lines() {
        let t = line.trim();
        if let Some(lang) = t.strip_prefix("```") {
            in_toml = !in_toml && lang.trim() == "toml";
            table.clear();
            continue;
        }
        if in_toml {
            let code = t.split(" #").next().unwrap().trim();
            if code.starts_with('[') {
                table = code.trim_matches(['[', ']']).trim().to_string();
            } else if let Some((key, value)) = code.split_once('=') {
                let (key, value) = (key.trim(), value.trim().trim_matches('"'));
                let writes = matches!(
                    (table.as_str(), key),
                    ("access_log", "path") | ("dispatcher", "admin_socket") | ("dispatcher", "bpffs")
                );
                if writes && value.starts_with('/') {
                    found.push(value.to_string());
                }
            }
            continue;
        }
        for word in line.split(|c: char| c.is_whitespace() || "`\"'(),;".contains(c)) {
            let word = word.trim_end_matches(['.', ':']);
            let agents =
                Path::new(word).components().any(|c| c.as_os_str().to_string_lossy().starts_with("dispatcher"));
            if ["/run/", "/var/", "/srv/"].iter().any(|r| word.starts_with(r)) && agents {
                found.push(word.to_string());
            }
        }
    }
    found.into_iter().map(|p| p.replace("<instance>", instance)).collect()
}

#[test]
fn the_agents_unit_lets_it_write_where_the_documentation_says() {
    let root = workspace();
    let unit = std::fs::read_to_string(root.join("packaging/systemd/dispatcher@.service")).unwrap();
    let sandbox = Sandbox::of(&unit, "default");
    assert!(sandbox.strict, "the unit is no longer ProtectSystem=strict: this test reads its sandbox as such");
    let mut docs = vec![root.join("README.md"), root.join("packaging/example.toml")];
    docs.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let mut checked = BTreeSet::new();
    let mut refused = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let toml = doc.extension().is_some_and(|e| e == "toml");
        for path in written_paths(&text, "default", toml) {
            if let Some(why) = sandbox.cannot_write(Path::new(&path)) {
                refused.push(format!(
                    "{}: {path} is {why} (dispatcher@.service)",
                    doc.strip_prefix(&root).unwrap().display()
                ));
            }
            checked.insert(path);
        }
    }
    eprintln!("written by the agent, as the documentation says: {checked:?}");
    assert!(refused.is_empty(), "{}", refused.join("\n"));
    // What the README's examples name is among what was checked: the access log, the
    // admin socket, the pins.
    for path in ["/var/log/dispatcher/access.log", "/run/dispatcher/default.sock", "/sys/fs/bpf"] {
        assert!(checked.contains(path), "{path} not found in the documentation: {checked:?}");
    }
    // The check can fail: without its LogsDirectory= the unit would refuse the README's
    // access log.
    let without: String = unit.lines().filter(|l| !l.starts_with("LogsDirectory=")).map(|l| format!("{l}\n")).collect();
    assert!(
        Sandbox::of(&without, "default").cannot_write(Path::new("/var/log/dispatcher/access.log")).is_some(),
        "a unit without LogsDirectory= lets the agent write /var/log"
    );
}
