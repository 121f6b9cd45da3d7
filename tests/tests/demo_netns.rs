//! `cargo xtask demo` as a user runs it: it completes, its "expected 0" lines are 0, no
//! session is lost or misrouted, and it leaves nothing behind.

use std::process::Command;

/// Runs the demo with `args`: its output (it must succeed), and a finder of the first line
/// containing a needle.
fn run_demo(args: &[&str]) -> (String, impl Fn(&str) -> String) {
    let out = Command::new(dispatcher_testbed::netns::built_bin("demo", &["testbed/src", "tools/src/bin/demo"]))
        .args(args)
        .output()
        .expect("run the demo");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let all = text.clone();
    let line = move |needle: &str| -> String {
        all.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no `{needle}` in:\n{all}")).to_string()
    };
    (text, line)
}

#[test]
fn the_demo_runs_its_story_and_cleans_up() {
    let (text, line) = run_demo(&["--seconds", "12"]);
    for step in ["[1/4]", "[2/4]", "[3/4]", "[4/4]"] {
        line(step);
    }
    for needle in [
        "operator: dispatcher drain b0 -> b0: up -> drain",
        "agent: b2 up -> suspect",
        "agent: b2 suspect -> down",
        "agent: b2 down -> up",
        "operator: dispatcher enable b0 -> b0: drain -> up",
    ] {
        line(needle);
    }
    assert!(line("new connections to b0 while drained:").contains("drained: 0 "), "{text}");
    assert!(line("new connections to b2 while down:").contains("down: 0 "), "{text}");
    assert!(line("misroutes (served by neither").contains("replica): 0 "), "{text}");
    assert!(line("sessions kept").contains("8 of 8; lost (no copy found): 0"), "{text}");
    assert!(line("requests answered").ends_with("errors 0"), "{text}");
    assert!(line("b2 crash -> down").contains(" ms"), "failover time measured: {text}");
    // SIP: every call completed across b2's crash, none met a container without its dialog.
    let calls = line("calls completed");
    let words: Vec<&str> = calls.split_whitespace().collect();
    assert!(words[2] == words[4].trim_end_matches(',') && words[2].parse::<u32>().unwrap() > 50, "{calls}");
    assert!(calls.contains("failed 0 (SIPp exit: 0)"), "{calls}");
    let misrouted = line("481 answers");
    assert!(
        misrouted.contains("not found): 0 (expected 0)") && misrouted.ends_with("dialog: 0 (expected 0)"),
        "{text}"
    );
    let torn = line("torn down");
    let instance = torn.split_whitespace().nth(1).unwrap().to_string();
    let namespaces =
        String::from_utf8_lossy(&Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).into_owned();
    assert!(!namespaces.contains(&instance), "namespaces of {instance} left: {namespaces}");
    assert!(!std::path::Path::new(&format!("/sys/fs/bpf/dispatcher/{instance}")).exists(), "pins left");
    assert!(!std::path::Path::new(&format!("/run/dispatcher/{instance}.sock")).exists(), "socket left");
}

/// `cargo xtask demo --tls`: the HTTP clients over HTTPS, the same story.
#[test]
fn the_demo_runs_over_https() {
    let (text, line) = run_demo(&["--seconds", "12", "--tls"]);
    assert!(line("HTTPS (8 clients").contains("a new connection every 10 requests"), "{text}");
    assert!(line("requests answered").ends_with("errors 0"), "{text}");
    assert!(line("sessions kept").contains("8 of 8; lost (no copy found): 0"), "{text}");
    assert!(line("misroutes (served by neither").contains("replica): 0 "), "{text}");
    let tls = line("TLS handshakes:");
    let words: Vec<&str> = tls.split_whitespace().collect();
    let (full, resumed): (u64, u64) = (words[2].parse().unwrap(), words[4].parse().unwrap());
    assert!(full >= 8 && resumed > full, "each client resumes its session when it reconnects: {tls}");
    assert!(tls.ends_with("failed 0"), "{tls}");
    assert!(line("tls app: handshakes").contains("CN=shop.example"), "{text}");
    line("torn down");
}

/// `cargo xtask demo --dispatchers 3`: behind the router, a join, a leave and a death;
/// its summary's "expected 0" lines are 0 and it leaves nothing behind.
#[test]
fn the_scale_out_demo_runs_and_cleans_up() {
    let (text, line) = run_demo(&["--seconds", "12", "--dispatchers", "3"]);
    for needle in ["-> d3 joins", "-> d1 leaves", "-> d3's host dies", "left: VIPs withdrawn"] {
        line(needle);
    }
    let broken = |row: &str| -> u64 { line(row).split_whitespace().rev().nth(1).unwrap().parse().unwrap() };
    assert_eq!(broken("  a dispatcher joins"), 0, "{text}");
    assert_eq!(broken("  a dispatcher leaves"), 0, "{text}");
    assert!(line("(lost):").ends_with(": 0 (expected 0)"), "{text}");
    assert!(line("does not own their session").ends_with(": 0 (expected 0)"), "{text}");
    let prefix = line("torn down").split_whitespace().nth(2).unwrap().trim_end_matches(':').to_string();
    let namespaces =
        String::from_utf8_lossy(&Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).into_owned();
    assert!(!namespaces.contains(&prefix), "namespaces of {prefix} left: {namespaces}");
    assert!(Command::new("pgrep").args(["-x", "bird"]).output().unwrap().stdout.is_empty(), "a BIRD left running");
}
