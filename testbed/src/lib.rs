//! Support for the dispatcher's tests: a packet builder and the XDP fixture harness
//! (BPF_PROG_TEST_RUN), and the network-namespace testbed.

pub mod browser;
pub mod cluster;
pub mod ecmp;
pub mod fixture;
pub mod netns;
pub mod packet;
pub mod scripted;
pub mod sipcontainer;
pub mod sipp;
pub mod tls;
pub mod websphere;

/// The TLS library the test clients use (for callers that configure them).
pub use rustls;

/// Checks Prometheus exposition text with a real parser: `promtool check metrics` (Debian's
/// prometheus package, which `cargo xtask setup` installs). `Err`: what it said.
pub fn promtool_check(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool (cargo xtask setup installs Debian's prometheus package): {e}"))?;
    child.stdin.take().unwrap().write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(said)
    }
}
