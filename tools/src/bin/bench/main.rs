//! `cargo xtask bench`: the benchmarks, each against its peers measured in the same run.
//! Writes `target/bench/report.json` and `target/bench/report.md`.

mod access_log;
mod charts;
mod cluster;
mod failover;
mod http;
mod l4;
mod load;
mod p99;
mod scale_out;
mod scaling;
mod sip;
mod stall;
mod tls;
mod xdp;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    let quick = has("--quick");
    let all = !has("--xdp")
        && !has("--http")
        && !has("--failover")
        && !has("--l4")
        && !has("--scaling")
        && !has("--cluster")
        && !has("--scale-out")
        && !has("--sip")
        && !has("--tls")
        && !has("--access-log")
        && !has("--p99");
    let mut parts = Vec::new();
    let mut md = String::new();
    if all || has("--xdp") {
        let (json, table) = xdp::run(quick);
        parts.push(format!(r#""xdp":{json}"#));
        md += "### XDP (ns/packet, BPF_PROG_TEST_RUN)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--scaling") {
        let (json, table) = scaling::run(quick);
        parts.push(format!(r#""scaling":{json}"#));
        md += "### Scaling (XDP cost vs flow-table fill and backend count)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--l4") {
        let (json, table) = l4::run(quick);
        parts.push(format!(r#""l4":{json}"#));
        md += "### L4 forwarding (connections/s, packets/s)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--http") {
        let (json, table) = http::run(quick);
        parts.push(format!(r#""http":{json}"#));
        md += "### HTTP (wrk, same backends, same worker count)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--failover") {
        let (json, table) = failover::run(quick);
        parts.push(format!(r#""failover":{json}"#));
        md += "### Failover (a clone killed or stopped under load)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--cluster") {
        let (json, table) = cluster::run(quick);
        parts.push(format!(r#""cluster":{json}"#));
        md += "### Several dispatchers (etcd, 3 dispatchers)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--scale-out") {
        let (json, table) = scale_out::run(quick);
        parts.push(format!(r#""scale_out":{json}"#));
        md += "### Behind a router (BGP, ECMP, connection steering)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--sip") {
        let (json, table) = sip::run(quick);
        parts.push(format!(r#""sip":{json}"#));
        md += "### SIP (SIPp through the XDP SIP VIP and through Kamailio)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--tls") {
        let (json, table) = tls::run(quick);
        parts.push(format!(r#""tls":{json}"#));
        md += "### TLS (HTTPS termination: wrk, openssl s_time, idle connections)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--p99") {
        let (json, table) = p99::run(quick);
        parts.push(format!(r#""p99":{json}"#));
        md += "### HTTP p99 against HAProxy (repeated rounds)\n\n";
        md += &table;
        md += "\n";
    }
    if all || has("--access-log") {
        let (json, table) = access_log::run(quick);
        parts.push(format!(r#""access_log":{json}"#));
        md += "### Access log (the same agent and load, logging off and on)\n\n";
        md += &table;
        md += "\n";
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let report = format!(r#"{{"kernel":"{}","cpus":{cpus},"quick":{quick},{}}}"#, kernel.trim(), parts.join(","));
    std::fs::write(dir.join("report.json"), &report).unwrap();
    // Charts (PNG via rsvg-convert) of what this run measured.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&report) {
        let files = charts::draw(&v, &dir);
        if !files.is_empty() {
            eprintln!("==> charts: {}", files.join(", "));
        }
    }
    std::fs::write(dir.join("report.md"), &md).unwrap();
    println!("\nreport: {} and report.md", dir.join("report.json").display());
}
