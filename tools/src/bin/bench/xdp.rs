//! XDP micro-benchmark: ns/packet of the XDP program through BPF_PROG_TEST_RUN, per
//! packet class and forwarding mode, beside a trivial XDP_PASS program measured in the
//! same run. Single-shot runs (the kernel reuses the rewritten buffer under `repeat`);
//! the median of many.

use crate::report::{self, Row};
use std::time::Duration;

use dispatcher_testbed::{
    fixture::{test_run, Fixture, CONFIG, XDP_DROP, XDP_PASS, XDP_TX},
    packet::{Packet, TCP_ACK},
};

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The mean of the middle half. The kernel's run times come in steps of about 10 ns, so a
/// median can only move by a step; the mean of the middle half resolves below that and,
/// as the median, ignores the outliers (interrupts, cache storms) at both ends.
fn iq_mean(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    let mid = &v[v.len() / 4..v.len() * 3 / 4];
    mid.iter().sum::<u64>() as f64 / mid.len().max(1) as f64
}

/// Sets of fresh maps the runs are spread over (each set: both programs' maps made anew,
/// in turn in either order); the range reported beside the after/before ratio is its
/// range over the sets.
const SETS: u32 = 4;

/// One packet class.
struct Case {
    name: &'static str,
    /// Packet for run `i` (new flows vary the source address and port).
    packet: Box<dyn Fn(u32) -> Vec<u8>>,
    verdict: u32,
    /// Running the output again takes the same path (no rewrite that changes the class),
    /// so a warm-cache figure with `repeat` is valid too.
    repeatable: bool,
    /// Target above the floor, ns.
    target: Option<u64>,
}

fn case(
    name: &'static str,
    packet: impl Fn(u32) -> Vec<u8> + 'static,
    verdict: u32,
    repeatable: bool,
    target: Option<u64>,
) -> Case {
    Case { name, packet: Box::new(packet), verdict, repeatable, target }
}

/// A new flow per run to a VIP of the fixture configuration: source port and address
/// advance with `i`.
fn new_flow(dst: &'static str, dport: u16, udp: bool) -> impl Fn(u32) -> Vec<u8> {
    move |i: u32| {
        let v6 = dst.contains(':');
        let (hi, port) = (i / 60000, 1024 + (i % 60000) as u16);
        let src = if v6 { format!("fd00::{:x}", 2 + hi) } else { format!("10.0.{}.{}", 1 + hi / 250, 2 + hi % 250) };
        if udp { Packet::udp(&src, port, dst, dport) } else { Packet::tcp(&src, port, dst, dport) }.build()
    }
}

fn fixed(p: Packet) -> impl Fn(u32) -> Vec<u8> {
    move |_| p.build()
}

/// SIP over UDP to the fixture's SIP VIP: headers as SIPp's UAC sends them (the scan
/// stops at the end of the header section, so the SDP body costs nothing).
fn sip(msg: String) -> Packet {
    Packet::udp("10.0.0.2", 5061, "10.0.100.5", 5060).with(|p| p.payload = msg.into_bytes())
}

/// An initial INVITE with a new Call-ID per run: placed on the ring by its Call-ID and
/// pinned.
fn sip_invite(i: u32) -> Vec<u8> {
    sip(format!(
        "INVITE sip:service@10.0.100.5:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2:5061;branch=z9hG4bK-{i}-1-0\r\nFrom: sipp <sip:sipp@10.0.0.2:5061>;tag={i}SIPpTag001\r\nTo: service <sip:service@10.0.100.5:5060>\r\nCall-ID: {i}-4242@10.0.0.2\r\nCSeq: 1 INVITE\r\nContact: sip:sipp@10.0.0.2:5061\r\nMax-Forwards: 70\r\nSubject: Performance Test\r\nContent-Type: application/sdp\r\nContent-Length: 0\r\n\r\n"
    ))
    .build()
}

/// An in-dialog BYE whose Route carries the container's ibmsid.
fn sip_bye() -> Packet {
    sip("BYE sip:service@10.0.100.5:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2:5061;branch=z9hG4bK-7-2\r\nRoute: <sip:10.0.100.5:5060;transport=udp;ibmsid=lnA.1153242645968.4_2_2;lr>\r\nFrom: sipp <sip:sipp@10.0.0.2:5061>;tag=7SIPpTag001\r\nTo: service <sip:service@10.0.100.5:5060>;tag=lnA.1153242645968_1_1\r\nCall-ID: 7-4242@10.0.0.2\r\nCSeq: 2 BYE\r\nContact: sip:sipp@10.0.0.2:5061\r\nMax-Forwards: 70\r\nSubject: Performance Test\r\nContent-Length: 0\r\n\r\n".into())
}

/// The commit whose XDP program the cases are measured against in the same run (the
/// code before the new-flow work of issue 32).
const BASELINE: &str = "e35c61f";

/// The bench's configuration: the fixtures' VIPs at the default ring size (65,537 slots,
/// 256 KiB of ring per VIP: where a new flow's ring read misses the caches), and one more
/// L4 VIP with a small ring (1,009 slots, as the fixture tests use) for the row that shows
/// what the ring's size costs.
fn bench_config() -> String {
    let mut s = CONFIG.replace("ring_size = 1009\n", "");
    assert!(!s.contains("ring_size"), "the fixture configuration's ring sizes changed");
    s += "\n[[vip]]\nname = \"mac4-small-ring\"\naddress = \"10.0.100.6\"\nport = 80\nring_size = 1009\n";
    s
}

/// The baseline's XDP object: built once from a git worktree of `BASELINE` (its own
/// target directory, kept under target/bench), then reused. `None`, with the reason on
/// stderr, outside a git checkout. `DISPATCHER_BENCH_BASELINE_OBJECT=FILE` takes another
/// build of the program instead (an experiment against a variant), and the report names it.
fn baseline_object() -> Option<Vec<u8>> {
    if let Some(path) = std::env::var_os("DISPATCHER_BENCH_BASELINE_OBJECT") {
        return std::fs::read(&path).map_err(|e| eprintln!("    no baseline: {}: {e}", path.to_string_lossy())).ok();
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let bench = root.join("target/bench");
    let cached = bench.join(format!("baseline-{BASELINE}.o"));
    if let Ok(b) = std::fs::read(&cached) {
        return Some(b);
    }
    let src = bench.join(format!("baseline-src-{BASELINE}"));
    let target = bench.join("baseline-target");
    let git = |args: &[&str]| std::process::Command::new("git").arg("-C").arg(&root).args(args).status();
    let _ = git(&["worktree", "remove", "--force", src.to_str().unwrap()]);
    if !git(&["worktree", "add", "--detach", src.to_str().unwrap(), BASELINE]).is_ok_and(|s| s.success()) {
        eprintln!("    no baseline: `git worktree add {BASELINE}` failed (not a git checkout with that commit?)");
        return None;
    }
    eprintln!("==> building the baseline XDP program ({BASELINE}) in {}", src.display());
    let built = std::process::Command::new("cargo")
        .args(["build", "--release", "-p", "dispatcher", "--lib"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .is_ok_and(|s| s.success());
    let _ = git(&["worktree", "remove", "--force", src.to_str().unwrap()]);
    if !built {
        eprintln!("    no baseline: building {BASELINE} failed");
        return None;
    }
    // The object the build script left in the dispatcher crate's OUT_DIR.
    let found = std::fs::read_dir(target.join("release/build"))
        .ok()?
        .flatten()
        .map(|e| e.path().join("out/dispatcher"))
        .filter(|p| p.exists())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())?;
    std::fs::copy(&found, &cached).ok()?;
    std::fs::read(&cached).ok()
}

/// New-flow cases run with FLOWS this full (entries of other clients' flows, of the
/// deployed 1,048,576): each case's name says which. Half: inserts find half the buckets
/// taken; full: every insert evicts the least recently used entry.
const HALF: u32 = dispatcher_common::DEFAULT_MAX_FLOWS / 2;
const FULL: u32 = dispatcher_common::DEFAULT_MAX_FLOWS;

/// Adds other clients' flows to the fixture's flow table, keys `from..to` (each key once
/// over the run), so that it holds about `to` entries with the ones the cases left.
fn fill_flows(fx: &mut Fixture, from: u32, to: u32) {
    for i in from..to {
        let key = dispatcher_common::FlowKey {
            src: [u32::from_be_bytes([172, 16 + (i >> 16) as u8, (i >> 8) as u8, i as u8]).to_be(), 0, 0, 0],
            dst: [u32::from_ne_bytes([10, 0, 100, 1]), 0, 0, 0],
            sport: 999u16.to_be(),
            dport: 80u16.to_be(),
            proto: 6,
            family: 2,
            _pad: 0,
        };
        let v = dispatcher_common::FlowValue { backend: i % 4, vip: 0, cookie_hash: 0, pinned_ns: 0 };
        let _ = fx.tables.flows.insert(key, v, 0);
    }
}

fn run_prog(ebpf: &mut aya::Ebpf, prog: &str, input: &[u8], repeat: u32) -> (u32, u64) {
    let o = test_run(ebpf, prog, input, repeat);
    (o.verdict, nanos(o.duration))
}

const EMPTY_CASE: &str = "L4 new flow, MAC, IPv4, FLOWS empty";
const HALF_CASE: &str = "L4 new flow, MAC, IPv4, FLOWS half full";
const FULL_CASE: &str = "L4 new flow, MAC, IPv4, FLOWS full";

pub fn run(quick: bool) -> (String, String) {
    let runs: u32 = if quick { 2_000 } else { 20_000 };
    let rounds: u32 = if quick { 5 } else { 21 };
    let config = bench_config();
    // `DISPATCHER_BENCH_OBJECT=FILE`: another build of the program in place of this
    // one's (experiments between two variants, with DISPATCHER_BENCH_BASELINE_OBJECT).
    let object =
        std::env::var_os("DISPATCHER_BENCH_OBJECT").map(|p| std::fs::read(p).expect("DISPATCHER_BENCH_OBJECT"));
    // The same cases through the baseline program, interleaved, in the same run.
    let base_obj = baseline_object();
    let mut pass = dispatcher::dataplane::load_pass().expect("load pass");

    let mut cases = vec![
        case("non-VIP pass", fixed(Packet::tcp("10.0.0.2", 4000, "10.0.0.99", 80)), XDP_PASS, true, None),
        case("HTTP VIP pass", fixed(Packet::tcp("10.0.0.2", 4000, "10.0.100.3", 80)), XDP_PASS, true, None),
        case(
            "malformed drop (IHL 4)",
            fixed(Packet::tcp("10.0.0.2", 4000, "10.0.100.1", 80).with(|p| p.ihl = 4)),
            XDP_DROP,
            true,
            None,
        ),
        // New flows: TCP SYNs (UDP: the first datagram) at the default ring size; FLOWS
        // starts empty and holds the new flows of the cases before.
        case(EMPTY_CASE, new_flow("10.0.100.1", 80, false), XDP_TX, false, Some(150)),
        case(
            "L4 new flow, MAC, IPv4, small ring (1,009 slots), FLOWS empty",
            new_flow("10.0.100.6", 80, false),
            XDP_TX,
            false,
            None,
        ),
        case("L4 new flow, IPIP, IPv4", new_flow("10.0.100.2", 80, false), XDP_TX, false, Some(150)),
        case("L4 new flow, MAC, IPv6 (UDP)", new_flow("fd00::100", 53, true), XDP_TX, false, Some(150)),
        case("L4 new flow, IPIP, IPv6", new_flow("fd00::200", 443, false), XDP_TX, false, Some(150)),
        case(
            "L4 established, MAC, IPv4",
            fixed(Packet::tcp("10.0.0.2", 4001, "10.0.100.1", 80).with(|p| p.tcp_flags = TCP_ACK)),
            XDP_TX,
            true,
            Some(60),
        ),
        case(
            "L4 established, IPIP, IPv4",
            fixed(Packet::tcp("10.0.0.2", 4001, "10.0.100.2", 80).with(|p| p.tcp_flags = TCP_ACK)),
            XDP_TX,
            false,
            Some(60),
        ),
        case(
            "L4 established, MAC, IPv6 (UDP)",
            fixed(Packet::udp("fd00::2", 4001, "fd00::100", 53)),
            XDP_TX,
            true,
            Some(60),
        ),
        case(
            "L4 established, IPIP, IPv6",
            fixed(Packet::tcp("fd00::2", 4001, "fd00::200", 443).with(|p| p.tcp_flags = TCP_ACK)),
            XDP_TX,
            false,
            Some(60),
        ),
        case("SIP INVITE, new dialog (Call-ID)", sip_invite, XDP_TX, false, None),
        case("SIP in-dialog BYE (Route ibmsid)", fixed(sip_bye()), XDP_TX, true, None),
        // Last: these fill the table (half, then full: every new flow then evicts one).
        case(HALF_CASE, new_flow("10.0.100.1", 80, false), XDP_TX, false, None),
        case(FULL_CASE, new_flow("10.0.100.1", 80, false), XDP_TX, false, None),
    ];
    // `DISPATCHER_BENCH_XDP_CASES=a,b`: only the cases whose names contain one of these.
    if let Ok(only) = std::env::var("DISPATCHER_BENCH_XDP_CASES") {
        cases.retain(|c| only.split(',').any(|o| c.name.contains(o)));
    }
    let floor_pkt = Packet::tcp("10.0.0.2", 4000, "10.0.100.1", 80).build();
    let sets = if quick { 2 } else { SETS };
    let per_set = runs / sets;
    eprintln!("==> XDP micro-benchmark: {runs} single-shot runs per case (median) over {sets} sets of fresh maps, and {rounds} rounds of repeat=1000 where valid");
    for _ in 0..1000 {
        run_prog(&mut pass, "pass", &floor_pkt, 1);
    }
    // Per case: this program's samples, the floor's, the baseline's, and each set's
    // after/before ratio; the warm figures (last set).
    let mut samples = vec![Vec::with_capacity(runs as usize); cases.len()];
    let mut floor = vec![Vec::with_capacity(runs as usize); cases.len()];
    let mut before = vec![Vec::with_capacity(runs as usize); cases.len()];
    let mut set_ratios = vec![Vec::new(); cases.len()];
    let mut warm = vec![None; cases.len()];
    for set in 0..sets {
        // Fresh maps for both programs each set, made in turn in either order: where the
        // kernel puts a 1M-entry table shows (an identical program measured against itself
        // came out 10-13% apart, always at the expense of the same one, with one pair).
        // The flow table as deployed (1M entries).
        let make_fx = || Fixture::with_object(&config, dispatcher_common::DEFAULT_MAX_FLOWS, object.as_deref());
        let make_base = || {
            base_obj.as_deref().map(|o| Fixture::with_object(&config, dispatcher_common::DEFAULT_MAX_FLOWS, Some(o)))
        };
        let (mut fx, mut base) = if set % 2 == 0 {
            let fx = make_fx();
            (fx, make_base())
        } else {
            let base = make_base();
            (make_fx(), base)
        };
        // The logical name the BYE names, as the agent would have written it.
        fx.set_clone("lnA", 0, Some(1), false);
        if let Some(b) = base.as_mut() {
            b.set_clone("lnA", 0, Some(1), false);
        }
        // Entries the cases have put in FLOWS so far (one per new flow or SIP dialog, one
        // per established case), and the fill keys used so far.
        let (mut pinned, mut filled) = (0u32, 0u32);
        for (ci, c) in cases.iter().enumerate() {
            let target = match c.name {
                HALF_CASE => Some(HALF),
                FULL_CASE => Some(FULL),
                _ => None,
            };
            if let Some(target) = target {
                let to = target.saturating_sub(pinned).max(filled);
                eprintln!("    set {set}: filling FLOWS to {target} entries in both programs' tables, in turns");
                // In slices, each table in turn, so that neither is the one last filled.
                let mut at = filled;
                while at < to {
                    let next = (at + 4096).min(to);
                    fill_flows(&mut fx, at, next);
                    if let Some(b) = base.as_mut() {
                        fill_flows(b, at, next);
                    }
                    at = next;
                }
                filled = to;
            }
            pinned += if c.name.contains("established") {
                1
            } else if c.repeatable {
                0
            } else {
                per_set
            };
            if c.name.contains("established") {
                // Pin the flow before timing (its packets carry ACK, as an established
                // connection's do).
                fx.run_bytes(&(c.packet)(0));
                if let Some(b) = base.as_mut() {
                    b.run_bytes(&(c.packet)(0));
                }
            }
            let (from_s, from_b, from_f) = (samples[ci].len(), before[ci].len(), floor[ci].len());
            for i in 0..per_set {
                let input = (c.packet)(i + ci as u32 * 1_000_000);
                // The floor and the baseline interleaved with the case, so that all three
                // see the same machine state; the case and the baseline take turns in going
                // first (whichever runs second finds the caches as the other left them).
                let mut current = |fx: &mut Fixture| {
                    let o = fx.run_bytes(&input);
                    assert_eq!(o.verdict, c.verdict, "{}: unexpected verdict", c.name);
                    samples[ci].push(nanos(o.duration));
                };
                let mut previous = |b: &mut Fixture| {
                    let o = b.run_bytes(&input);
                    assert_eq!(o.verdict, c.verdict, "{} (baseline): unexpected verdict", c.name);
                    before[ci].push(nanos(o.duration));
                };
                match base.as_mut() {
                    Some(b) if i % 2 == 1 => {
                        previous(b);
                        floor[ci].push(run_prog(&mut pass, "pass", &floor_pkt, 1).1);
                        current(&mut fx);
                    }
                    Some(b) => {
                        current(&mut fx);
                        floor[ci].push(run_prog(&mut pass, "pass", &floor_pkt, 1).1);
                        previous(b);
                    }
                    None => {
                        current(&mut fx);
                        floor[ci].push(run_prog(&mut pass, "pass", &floor_pkt, 1).1);
                    }
                }
            }
            if base.is_some() {
                let f = iq_mean(floor[ci][from_f..].to_vec());
                let was = iq_mean(before[ci][from_b..].to_vec()) - f;
                set_ratios[ci].push((iq_mean(samples[ci][from_s..].to_vec()) - f) / was.max(1.0));
            }
            // Warm: the same packet many times in the kernel's loop, caches hot.
            if set == sets - 1 && c.repeatable {
                let input = (c.packet)(0);
                let mut w = Vec::new();
                let mut f = Vec::new();
                for _ in 0..rounds {
                    w.push(run_prog(dispatcher_ebpf(&mut fx), "dispatcher", &input, 1000).1);
                    f.push(run_prog(&mut pass, "pass", &floor_pkt, 1000).1);
                }
                warm[ci] = Some((median(w), median(f)));
            }
        }
    }
    let mut rows = Vec::new();
    for (ci, c) in cases.iter().enumerate() {
        let (samples, floor, before) = (samples[ci].clone(), floor[ci].clone(), before[ci].clone());
        // Before and after by the middle-half mean, each less the floor's.
        let versus = (!before.is_empty()).then(|| {
            let f = iq_mean(floor.clone());
            let r = &set_ratios[ci];
            let range = (r.iter().cloned().fold(f64::MAX, f64::min), r.iter().cloned().fold(f64::MIN, f64::max));
            (iq_mean(before.clone()) - f, iq_mean(samples.clone()) - f, range)
        });
        let cold = (median(samples), median(floor));
        let baseline = (!before.is_empty()).then(|| median(before));
        let warm = warm[ci];
        let warm_s = warm.map(|(w, f)| format!("{w} ns (floor {f})")).unwrap_or_else(|| "-".into());
        let base_s = baseline.map(|b| format!(", baseline {b} ns")).unwrap_or_default();
        eprintln!("    {:<28} single-shot {:>4} ns (floor {}){base_s}, warm {warm_s}", c.name, cold.0, cold.1);
        rows.push((c.name, cold, warm, c.target, baseline, versus));
    }
    let mut table_rows = Vec::new();
    let mut versus = String::new();
    if base_obj.is_some() {
        let of = match std::env::var_os("DISPATCHER_BENCH_BASELINE_OBJECT") {
            Some(p) => format!("the program in {}", p.to_string_lossy()),
            None => format!("the program of commit {BASELINE}"),
        };
        versus = format!("\nBefore and after in this run: the same cases through {of}, interleaved single-shot runs, ns above the floor: medians, and means of the middle half (the run times come in ~10 ns steps, which medians cannot split); the range is that ratio's over the {sets} sets of fresh maps the runs were spread over:\n\n| case | before (median) | after (median) | before (mid-half mean) | after (mid-half mean) | after / before (mid-half mean) | range over sets |\n|---|---:|---:|---:|---:|---:|---:|\n");
    }
    for (name, (m, f), warm, target, baseline, means) in &rows {
        if let (Some(b), Some((was_mean, now_mean, (lo, hi)))) = (baseline, means) {
            let (was, now) = (b.saturating_sub(*f), m.saturating_sub(*f));
            versus += &format!(
                "| {name} | {was} | {now} | {was_mean:.1} | {now_mean:.1} | {:.2} | {lo:.2}-{hi:.2} |\n",
                now_mean / was_mean.max(1.0)
            );
        }
        let above = m.saturating_sub(*f);
        let (t, met) = match target {
            Some(t) => (format!("<= {t}"), if above <= *t { "yes" } else { "no" }),
            None => ("-".into(), "-"),
        };
        let warm_ns = |v: fn((u64, u64)) -> u64| warm.map(|w| v(w) as f64);
        table_rows.push(
            Row::new()
                .text("case", "case", name)
                .int("single-shot ns", "ns", m)
                .int("floor", "floor_ns", f)
                .int("above floor", "above_floor_ns", above)
                .opt("warm ns", "", warm_ns(|(w, _)| w), 0, 0)
                .opt("warm floor", "", warm_ns(|(_, f)| f), 0, 0)
                .opt("warm above floor", "", warm_ns(|(w, f)| w.saturating_sub(f)), 0, 0)
                .json("warm", warm.map(|(w, f)| format!(r#"{{"ns":{w},"floor_ns":{f}}}"#)).unwrap_or("null".into()))
                .md("target above floor", t)
                .json("target_above_floor_ns", target.map(|t| t.to_string()).unwrap_or("null".into()))
                .text("met (single-shot)", "", met)
                .json("baseline_ns", baseline.map(|b| b.to_string()).unwrap_or("null".into()))
                .json(
                    "mid_half_mean_above_floor",
                    means
                        .map(|(b, a, (lo, hi))| {
                            format!(r#"{{"before":{b:.1},"after":{a:.1},"ratio_range":[{lo:.3},{hi:.3}]}}"#)
                        })
                        .unwrap_or("null".into()),
                ),
        );
    }
    let mut table = report::markdown(&table_rows);
    table += &versus;
    println!("\n{table}");
    (format!(r#"{{"runs_per_case":{runs},"cases":{}}}"#, report::json(&table_rows)), table)
}

fn dispatcher_ebpf(fx: &mut Fixture) -> &mut aya::Ebpf {
    fx.ebpf_mut()
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}
