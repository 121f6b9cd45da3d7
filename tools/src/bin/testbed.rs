//! `cargo xtask testbed up|down`: a standing testbed to explore by hand.

use dispatcher_tests::netns::{backend_ip, Testbed, LB_IP};

const PREFIX: &str = "dtbed";
const VIP: &str = "10.99.100.1";

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("up") => {
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
        Some("down") => {
            let n = Testbed::remove(PREFIX);
            println!("testbed `{PREFIX}` removed ({n} namespaces)");
        }
        _ => {
            eprintln!("usage: testbed up|down");
            std::process::exit(2);
        }
    }
}
