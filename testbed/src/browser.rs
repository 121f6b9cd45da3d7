//! A real browser for the tests: headless Chromium (Debian's `chromium`, which `cargo
//! xtask setup` installs), started inside a test's namespace and driven over the DevTools
//! protocol on a pipe (`--remote-debugging-pipe`: it reads commands on descriptor 3 and
//! writes replies and events on 4, each a JSON message ended by a NUL byte). One page
//! stays open while the test changes the world under it, and the test reads the DOM as
//! the page's own script left it.
//!
//! Bounded: every reply is awaited at most `REPLY_TIME`; the browser runs in a process
//! group of its own, which drop ends (SIGTERM, then SIGKILL) by its PID; the temporary
//! profile is removed then.

use std::{
    fs::File,
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::netns::Ns;

/// How long a DevTools command may take to be answered.
const REPLY_TIME: Duration = Duration::from_secs(20);

pub struct Browser {
    child: Child,
    to: std::io::PipeWriter,
    from: mpsc::Receiver<Value>,
    /// Events that came while a reply was awaited.
    events: std::collections::VecDeque<Value>,
    next_id: u64,
    /// The page's DevTools session.
    session: String,
    profile: PathBuf,
}

impl Browser {
    /// Opens `url` in a headless Chromium started in `ns`, in a `width` x `height` window
    /// (device pixels); its output goes to `log`.
    pub fn open(ns: &Ns, url: &str, (width, height): (u32, u32), log: &Path) -> Browser {
        use std::os::unix::process::CommandExt;
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let profile = std::env::temp_dir().join(format!("dispatcher-test-chromium-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&profile).expect("the browser's profile directory");
        let (their_in, to) = std::io::pipe().expect("pipe");
        let (from, their_out) = std::io::pipe().expect("pipe");
        let (fd_in, fd_out) = {
            use std::os::fd::AsRawFd;
            (their_in.as_raw_fd(), their_out.as_raw_fd())
        };
        let log = File::create(log).expect("browser log");
        let mut cmd = ns.command("chromium");
        cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run"])
            .args(["--no-default-browser-check", "--disable-extensions", "--disable-background-networking"])
            .args(["--disable-sync", "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars"])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("browser log"))
            .stderr(log)
            .process_group(0);
        // The pipe ends become descriptors 3 and 4 of the browser (dup2 clears their
        // close-on-exec). Copied above 10 first, so that neither dup2 can overwrite the
        // other end.
        unsafe {
            cmd.pre_exec(move || {
                let high_in = nix::libc::fcntl(fd_in, nix::libc::F_DUPFD_CLOEXEC, 10);
                let high_out = nix::libc::fcntl(fd_out, nix::libc::F_DUPFD_CLOEXEC, 10);
                if high_in < 0 || high_out < 0 || nix::libc::dup2(high_in, 3) < 0 || nix::libc::dup2(high_out, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("starting chromium (cargo xtask setup installs it): {e}"));
        drop((their_in, their_out));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || read_messages(from, tx));
        let mut b =
            Browser { child, to, from: rx, events: Default::default(), next_id: 0, session: String::new(), profile };
        let target = b.command(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let target = target["targetId"].as_str().expect("a target id").to_string();
        let attached = b.command(None, "Target.attachToTarget", json!({ "targetId": target, "flatten": true }));
        b.session = attached["sessionId"].as_str().expect("a session id").to_string();
        let metrics = json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false });
        b.call("Emulation.setDeviceMetricsOverride", metrics);
        b.call("Page.enable", json!({}));
        let nav = b.call("Page.navigate", json!({ "url": url }));
        assert!(nav.get("errorText").is_none(), "opening {url}: {nav}");
        b
    }

    /// A command to the browser (`session` None) or to a page; its result, or a panic
    /// with the browser's error.
    fn command(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap_or_else(|e| panic!("{method}: the browser is gone ({e})"));
        let deadline = Instant::now() + REPLY_TIME;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply =
                self.from.recv_timeout(left).unwrap_or_else(|e| panic!("{method}: no reply from the browser ({e})"));
            if reply["id"] == json!(id) {
                assert!(reply.get("error").is_none(), "{method}: {}", reply["error"]);
                return reply["result"].clone();
            }
            if reply.get("method").is_some() {
                self.events.push_back(reply);
            }
        }
    }

    /// A command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.command(Some(&session), method, params)
    }

    /// The value of a JavaScript expression in the page (thrown exceptions panic).
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true }));
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {}", r["exceptionDetails"]);
        r["result"]["value"].clone()
    }

    /// Evaluates `expression` every 200 ms until `done` says yes (its last value is
    /// returned); panics with `what` and the last value after `limit`.
    pub fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        expression: &str,
        mut done: impl FnMut(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.eval(expression);
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: not after {limit:?}; the page shows {v}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// From now on the page's requests to URLs matching `pattern` (`*` any text) wait
    /// for the test to answer them (`answer_next`).
    pub fn intercept(&mut self, pattern: &str) {
        self.call("Fetch.enable", json!({ "patterns": [{ "urlPattern": pattern }] }));
    }

    /// Answers the next intercepted request (waiting for it at most `limit`) with 200
    /// and `body` of `content_type`, as if its server had; returns the request's URL.
    pub fn answer_next(&mut self, content_type: &str, body: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let paused = loop {
            if let Some(at) = self.events.iter().position(|e| e["method"] == "Fetch.requestPaused") {
                break self.events.remove(at).unwrap_or_default();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self.from.recv_timeout(left).unwrap_or_else(|e| panic!("no intercepted request ({e})"));
            self.events.push_back(ev);
        };
        let params = &paused["params"];
        let answer = json!({
            "requestId": params["requestId"],
            "responseCode": 200,
            "responseHeaders": [{ "name": "Content-Type", "value": content_type }],
            "body": base64::engine::general_purpose::STANDARD.encode(body),
        });
        self.call("Fetch.fulfillRequest", answer);
        params["request"]["url"].as_str().unwrap_or_default().to_string()
    }

    /// A PNG of what the page shows.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("screenshot in base64")
    }
}

/// Width and height of a PNG, read from its signature and IHDR chunk; None if `bytes`
/// is not a PNG.
pub fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if bytes.len() < 24 || &bytes[..8] != SIGNATURE || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    Some((be(16), be(20)))
}

/// Reads NUL-terminated JSON messages until the browser closes its end.
fn read_messages(mut from: std::io::PipeReader, tx: mpsc::Sender<Value>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        match from.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        while let Some(end) = buf.iter().position(|&b| b == 0) {
            let msg: Vec<u8> = buf.drain(..=end).collect();
            if let Ok(v) = serde_json::from_slice(&msg[..end]) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The browser's group: the browser and the renderer and helper processes it
        // started (the group's id is the browser's PID).
        let group = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
