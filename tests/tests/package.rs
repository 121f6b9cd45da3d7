//! `cargo xtask package`: the Debian package builds, holds what an operator expects,
//! passes lintian without errors, installs into a throwaway root with dpkg (its own
//! database), and its systemd units pass `systemd-analyze verify` there.

use std::{
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
