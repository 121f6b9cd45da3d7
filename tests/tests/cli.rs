//! The command line as an operator meets it.

use std::process::Command;

use dispatcher_tests::netns::dispatcher_bin;

static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn check(text: &str) -> (i32, String, String) {
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("dispatcher-cli-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("d.toml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(dispatcher_bin()).arg("check").arg(&file).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

const GOOD: &str = "[dispatcher]\ninterface = \"eth0\"\n\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.1\"\nmac = \"02:00:00:00:00:01\"\n\n[[vip]]\nname = \"v\"\naddress = \"10.0.100.1\"\nport = 80\n";

#[test]
fn check_accepts_a_valid_file() {
    let (code, out, _) = check(GOOD);
    assert_eq!(code, 0);
    assert!(out.contains("ok (1 VIPs, 1 backends)"), "{out}");
}

#[test]
fn check_names_file_line_and_field() {
    let (code, _, err) = check(&GOOD.replace("port = 80", "port = 0"));
    assert_eq!(code, 1);
    assert!(err.contains("d.toml:12: vip[0].port: must be 1..=65535"), "{err}");

    let (code, _, err) = check(&GOOD.replace("mac = \"02:00:00:00:00:01\"\n", ""));
    assert_eq!(code, 1);
    assert!(err.contains("backend[0].mac: required: backend `a` serves L4 VIP `v`"), "{err}");

    let (code, _, err) = check(&GOOD.replace("interface", "interfaces"));
    assert_eq!(code, 1);
    assert!(err.contains("d.toml:2: unknown field `interfaces`"), "{err}");

    let (code, _, err) = check("this is not toml");
    assert_eq!(code, 1);
    assert!(err.contains("d.toml:1:"), "{err}");
}

#[test]
fn check_reports_a_missing_file() {
    let out = Command::new(dispatcher_bin()).args(["check", "/nonexistent/d.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/d.toml: cannot read"));
}
