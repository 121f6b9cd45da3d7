//! The demo's SIP part: SIPp places calls through a SIP VIP (XDP only: no proxy in the
//! path) to a WebSphere-like SIP container on every backend; when b2 crashes its
//! dialogs (logical name `ln2`) go to its replica b3, and every call completes.

use std::time::Duration;

use dispatcher::dataplane::tables::Tables;
use dispatcher_testbed::{
    netns::{Testbed, CLIENT_IP},
    sipcontainer::SipCluster,
    sipp,
};
use std::sync::Arc;

pub const SIP_VIP: &str = "10.99.100.9";
/// The VIP's index in the demo's configuration (its SIP counters' slot).
pub const VIP_INDEX: u32 = 3;
const RATE: u32 = 10;
const CALL_MS: u32 = 2000;

/// The `[[vip]]` section, and each backend's logical name for its `[[backend]]`.
pub fn vip_config() -> String {
    format!("\n[[vip]]\nname = \"calls\"\naddress = \"{SIP_VIP}\"\nport = 5060\nmode = \"sip\"\n")
}

pub fn backend_lines(i: usize) -> String {
    format!("logical_names = [\"{}\"]\n", SipCluster::logical_name(i))
}

pub struct Calls {
    pub cluster: Arc<SipCluster>,
    pub calls: u32,
}

/// SIP containers on every backend, and SIPp's calls for about `seconds` - 3 s.
pub fn start(tb: &mut Testbed, seconds: u64) -> Calls {
    let cluster = SipCluster::new(tb.backends.len());
    tb.start_sip(&cluster, SIP_VIP, 5060);
    let calls = RATE * (seconds as u32 - 3);
    let (client, target) = (tb.client.clone(), format!("{SIP_VIP}:5060"));
    let run = sipp::Run {
        ns: &client,
        target: &target,
        local_ip: CLIENT_IP,
        calls,
        rate: RATE,
        pause_ms: CALL_MS,
        scenario: None,
    };
    sipp::start(tb, &run, "sipp");
    Calls { cluster, calls }
}

impl Calls {
    pub fn crash(&self, i: usize) {
        self.cluster.kill(i);
    }

    pub fn restart(&self, tb: &mut Testbed, i: usize) {
        self.cluster.revive(i);
        tb.start_sip_on(&self.cluster, SIP_VIP, i, 5060);
    }

    /// Waits for SIPp's last calls and prints what happened to them.
    pub fn summary(&self, tb: &mut Testbed, tables: &Tables, crashed: usize) {
        let (status, c) = sipp::finish(tb, "sipp", Duration::from_secs(30));
        let n = |k: &str| c.get(k).copied().unwrap_or(0);
        println!(
            "SIP (SIPp: {} calls of {} s at {RATE} calls/s to {SIP_VIP}:5060, routed by XDP alone):",
            self.calls,
            CALL_MS / 1000
        );
        println!(
            "  calls completed {} of {}, failed {} (SIPp exit: {}), retransmissions {}",
            n("SuccessfulCall"),
            self.calls,
            n("FailedCall"),
            status.code().map(|c| c.to_string()).unwrap_or_else(|| "signal".into()),
            n("Retransmissions")
        );
        println!(
            "  481 answers (dialog not found): {} (expected 0); messages to a container without the dialog: {} (expected 0)",
            self.cluster.not_found.load(std::sync::atomic::Ordering::SeqCst),
            self.cluster.misroutes().len()
        );
        println!(
            "  b{crashed}'s dialogs served by its replica b{} while it was down: {} messages",
            crashed ^ 1,
            self.cluster.served_for_peer(crashed ^ 1)
        );
        let counts = tables.sip_counters(VIP_INDEX).unwrap_or_default();
        let line: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("  the XDP program's verdicts: {}", line.join(", "));
    }
}
