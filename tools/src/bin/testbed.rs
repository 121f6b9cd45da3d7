//! `cargo xtask testbed up|down`: a standing testbed to explore by hand; with
//! `--dispatchers N`, N dispatchers sharing a 3-member etcd cluster.

use dispatcher_testbed::{
    cluster::{client_ip, dispatcher_ip, etcd_ip, Multi, ETCD_MEMBERS, VIP as CLUSTER_VIP},
    netns::{backend_ip, Testbed, LB_IP},
};

const PREFIX: &str = "dtbed";
const VIP: &str = "10.99.100.1";

/// `up --dispatchers N`: etcd running, dispatchers configured (not started).
fn up_cluster(n: usize) {
    Multi::stop_persisted(PREFIX);
    Testbed::remove(PREFIX);
    let m = Multi::with_prefix(PREFIX.into(), n, 4, false);
    println!("testbed `{PREFIX}` is up with a 3-member etcd cluster and {n} dispatchers:");
    for i in 0..ETCD_MEMBERS {
        println!("  {PREFIX}-e{i}: etcd member e{i}, http://{}:2379 (running)", etcd_ip(i));
    }
    for (i, d) in m.dispatchers.iter().enumerate() {
        println!(
            "  {}: dispatcher d{i} at {}, VIP {CLUSTER_VIP} on lo; its client {PREFIX}-c{i} ({}) routes the VIP through it",
            d.ns.name,
            dispatcher_ip(i),
            client_ip(i)
        );
        println!(
            "      run it:  nsenter --net=/run/netns/{} target/debug/dispatcher run --config {}",
            d.ns.name,
            d.config.display()
        );
    }
    for i in 0..4 {
        println!("  {PREFIX}-b{i}: clone at {} (serve port 8080 yourself, e.g. ip netns exec {PREFIX}-b{i} python3 -m http.server 8080)", backend_ip(i));
    }
    println!("  from a client:   ip netns exec {PREFIX}-c0 curl http://{CLUSTER_VIP}/");
    println!(
        "  the shared keys: ip netns exec {PREFIX}-e0 etcdctl --endpoints https://{}:2379 --cacert {} --cert {} --key {} --user root:{} get --prefix {}",
        etcd_ip(0),
        m.pki.path("ca.pem").display(),
        m.pki.path("client-root.pem").display(),
        m.pki.path("client-root.key").display(),
        m.root_password,
        m.key_prefix
    );
    println!("  etcd runs with TLS and authentication; the dispatchers' user may use {}/ only", m.key_prefix);
    println!("  take it down:    cargo xtask testbed down (stop the dispatchers first: dispatcher stop --detach --config ...)");
    m.persist();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dispatchers =
        args.iter().position(|a| a == "--dispatchers").and_then(|i| args.get(i + 1)).and_then(|n| n.parse().ok());
    match (args.get(1).map(String::as_str), dispatchers) {
        (Some("up"), Some(n)) => up_cluster(n),
        (Some("up"), None) => {
            Testbed::remove(PREFIX);
            let tb = Testbed::with_prefix(PREFIX.into(), 4, &[VIP]);
            let cfg = format!(
                "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{PREFIX}\"\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\n",
                tb.backend_config(&[])
            );
            let path = tb.write_config(&cfg);
            println!("testbed `{PREFIX}` is up:");
            println!("  namespaces: {PREFIX}-cl (client 10.99.0.2), {PREFIX}-lb (dispatcher {LB_IP}, eth0), {PREFIX}-sw (bridge)");
            for i in 0..4 {
                println!("              {PREFIX}-b{i} (backend {}, VIP {VIP} on lo)", backend_ip(i));
            }
            println!("  configuration: {}", path.display());
            println!(
                "  run the dispatcher:  nsenter --net=/run/netns/{PREFIX}-lb target/debug/dispatcher run --config {}",
                path.display()
            );
            println!("  a backend server:    ip netns exec {PREFIX}-b0 python3 -m http.server 80");
            println!("  from the client:     ip netns exec {PREFIX}-cl curl http://{VIP}/");
            println!("  take it down:        cargo xtask testbed down");
            tb.persist();
        }
        (Some("down"), _) => {
            let etcd = Multi::stop_persisted(PREFIX);
            let n = Testbed::remove(PREFIX);
            println!("testbed `{PREFIX}` removed ({n} namespaces, {etcd} etcd processes stopped)");
        }
        _ => {
            eprintln!("usage: testbed up [--dispatchers N] | down");
            std::process::exit(2);
        }
    }
}
