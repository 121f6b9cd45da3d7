//! The agent under a service manager: the `sd_notify` messages a `Type=notify` unit
//! relies on (READY, watchdog pings, RELOADING/READY around a reload, STOPPING), recorded
//! from the socket `NOTIFY_SOCKET` names; and its log lines in the journal's conventions
//! when stderr is the journal's stream.

use std::{
    os::unix::{fs::MetadataExt, net::UnixDatagram},
    time::{Duration, Instant},
};

use dispatcher_testbed::netns::{dispatcher_bin, Testbed};

const VIP: &str = "10.99.100.8";

fn config(tb: &Testbed) -> std::path::PathBuf {
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config(&[])
    );
    tb.write_config(&text)
}

/// Starts the agent with `env` and waits until it logs that it runs.
fn start_with_env(tb: &mut Testbed, config: &std::path::Path, env: &[(&str, String)]) {
    let mut cmd = tb.lb.command(dispatcher_bin());
    cmd.arg("run").arg("--config").arg(config);
    for (k, v) in env {
        cmd.env(k, v);
    }
    tb.start_dispatcher_command(cmd);
}

/// Messages received on `sock` until `until` matches one (or 10 s pass).
fn receive_until(sock: &UnixDatagram, got: &mut Vec<String>, until: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = until(&m);
            got.push(m);
            if done {
                return;
            }
        }
    }
    panic!("not received; got {got:?}");
}

#[test]
fn the_service_manager_hears_ready_watchdog_reload_and_stopping() {
    let mut tb = Testbed::new(2, &[VIP]);
    let path = config(&tb);
    let sock_path = tb.workdir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let env = [("NOTIFY_SOCKET", sock_path.display().to_string()), ("WATCHDOG_USEC", "400000".to_string())];
    start_with_env(&mut tb, &path, &env);
    let pid = tb.pid_of("dispatcher").unwrap();
    let mut got = Vec::new();
    receive_until(&sock, &mut got, |m| m.starts_with("READY=1"));
    let ready = got.last().unwrap().clone();
    assert!(
        ready.contains(&format!("MAINPID={pid}")) && ready.contains("STATUS=serving 1 VIPs, 2 backends"),
        "{ready}"
    );
    // The agent logged that it runs (maps filled, listeners bound) before it said READY.
    // Watchdog pings every 200 ms (half of WATCHDOG_USEC): at least 4 in 1.2 s.
    got.clear();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1200) {
        receive_until(&sock, &mut got, |m| m == "WATCHDOG=1");
    }
    let pings = got.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!((4..=8).contains(&pings), "{pings} pings in 1.2 s: {got:?}");
    // A reload: RELOADING, then READY with how it went.
    let cfg = path.display().to_string();
    tb.dispatcher_cmd(&["reload", "--config", &cfg]);
    got.clear();
    receive_until(&sock, &mut got, |m| m.starts_with("READY=1"));
    assert!(got.iter().any(|m| m == "RELOADING=1"), "{got:?}");
    assert!(got.last().unwrap().contains("STATUS=reloaded: "), "{got:?}");
    // SIGHUP reloads too (and does not end the agent).
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGHUP).unwrap();
    got.clear();
    receive_until(&sock, &mut got, |m| m.starts_with("READY=1"));
    assert!(got.iter().any(|m| m == "RELOADING=1") && got.last().unwrap().contains("STATUS=reloaded: "), "{got:?}");
    assert!(tb.log("dispatcher").contains("SIGHUP: reloading"));
    // Stopping.
    tb.dispatcher_cmd(&["stop", "--config", &cfg, "--detach"]);
    got.clear();
    receive_until(&sock, &mut got, |m| m.starts_with("STOPPING=1"));
    assert!(got.last().unwrap().contains("STATUS=stopping (dispatcher stop)"), "{got:?}");
}

#[test]
fn a_watchdog_for_another_process_is_not_pinged() {
    let mut tb = Testbed::new(2, &[VIP]);
    let path = config(&tb);
    let sock_path = tb.workdir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let env = [
        ("NOTIFY_SOCKET", sock_path.display().to_string()),
        ("WATCHDOG_USEC", "200000".to_string()),
        ("WATCHDOG_PID", "1".to_string()),
    ];
    start_with_env(&mut tb, &path, &env);
    let mut got = Vec::new();
    receive_until(&sock, &mut got, |m| m.starts_with("READY=1"));
    std::thread::sleep(Duration::from_millis(600));
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(!got.iter().any(|m| m == "WATCHDOG=1"), "{got:?}");
}

#[test]
fn log_lines_follow_the_journals_conventions_when_stderr_is_the_journal() {
    let mut tb = Testbed::new(2, &[VIP]);
    let path = config(&tb);
    // The log file the testbed gives the agent's stderr: created first, so its device
    // and inode can be named as the journal's stream (the testbed truncates, same inode).
    let log = tb.workdir.join("dispatcher.log");
    std::fs::write(&log, "").unwrap();
    let meta = std::fs::metadata(&log).unwrap();
    start_with_env(&mut tb, &path, &[("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))]);
    let text = tb.log("dispatcher");
    assert!(!text.contains('\u{1b}'), "no ANSI colours: {text:?}");
    let running = text.lines().find(|l| l.contains("dispatcher running")).unwrap();
    assert!(running.starts_with("<6> INFO") || running.starts_with("<6>INFO"), "{running:?}");
    assert!(text.lines().all(|l| l.starts_with('<') || !l.contains(" INFO ")), "{text}");
}
