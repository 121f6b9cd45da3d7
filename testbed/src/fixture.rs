//! XDP packet fixtures through BPF_PROG_TEST_RUN: load the real program with private
//! (unpinned) maps, fill them from a configuration, run a packet, read verdict, output
//! bytes and counters.

use std::time::Duration;

use aya::{
    maps::{HashMap, MapData},
    programs::{TestRun, TestRunOptions},
    Ebpf,
};
use dispatcher::{
    config::Config,
    dataplane::{
        self,
        tables::{addr_key, backend_info, initial_states, vip_key, Tables},
        LoadOptions,
    },
};
use dispatcher_common::{
    hash::{cookie_hash, flow_hash},
    sip_call_key, AffinityKey, AffinityValue, CloneValue, FlowKey, FlowValue, FragKey, FragValue, SteerConf, SteerSlot,
    CLONE_F_FAILED_OVER, NO_BACKEND, STEER_SIZE,
};

use crate::packet::Packet;

/// The fixtures' configuration: two replica pairs, VIPs for each forwarding mode and
/// family (VIP ids in order: mac4, ipip4, mac6 (udp/53), ipip6 (tcp/443), http,
/// sticky-a, sticky-b, sip (udp/5060)). The CLONES map is the tests' to fill
/// (`set_clone`): no agent runs here.
pub const CONFIG: &str = r#"
[dispatcher]
interface = "lo"

[[backend]]
name = "b0"
address = "10.0.0.10"
address6 = "fd00::10"
mac = "02:00:00:00:01:00"
replica = "b1"

[[backend]]
name = "b1"
address = "10.0.0.11"
address6 = "fd00::11"
mac = "02:00:00:00:01:01"
replica = "b0"

[[backend]]
name = "b2"
address = "10.0.0.12"
address6 = "fd00::12"
mac = "02:00:00:00:01:02"
replica = "b3"

[[backend]]
name = "b3"
address = "10.0.0.13"
address6 = "fd00::13"
mac = "02:00:00:00:01:03"
replica = "b2"

[[vip]]
name = "mac4"
address = "10.0.100.1"
port = 80
ring_size = 1009

[[vip]]
name = "ipip4"
address = "10.0.100.2"
port = 80
forwarding = "ipip"
encap_source = "10.0.0.1"
ring_size = 1009

[[vip]]
name = "mac6"
address = "fd00::100"
port = 53
protocol = "udp"
ring_size = 1009

[[vip]]
name = "ipip6"
address = "fd00::200"
port = 443
forwarding = "ipip"
encap_source = "fd00::1"
ring_size = 1009

[[vip]]
name = "http"
address = "10.0.100.3"
port = 80
mode = "http"
ring_size = 1009

[[vip]]
name = "sticky-a"
address = "10.0.100.4"
port = 80
sticky_time = "300s"
port_group = "g"
ring_size = 1009

[[vip]]
name = "sticky-b"
address = "10.0.100.4"
port = 443
sticky_time = "300s"
port_group = "g"
ring_size = 1009

[[vip]]
name = "sip"
address = "10.0.100.5"
port = 5060
mode = "sip"
ring_size = 1009
"#;

pub struct Fixture {
    ebpf: Ebpf,
    pub tables: Tables,
    pub affinity: HashMap<MapData, AffinityKey, AffinityValue>,
    pub cfg: Config,
    pub states: Vec<u8>,
}

/// The verdict, the output frame, and the program's own run time.
pub struct Outcome {
    pub verdict: u32,
    pub out: Vec<u8>,
    pub duration: Duration,
}

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

/// Runs an XDP program of `ebpf` on `input` through BPF_PROG_TEST_RUN. With `repeat > 1`
/// the kernel runs it on its own output again and reports the mean duration.
pub fn test_run(ebpf: &mut Ebpf, prog: &str, input: &[u8], repeat: u32) -> Outcome {
    let xdp = dataplane::program(ebpf, prog).expect("program");
    let mut out = vec![0u8; input.len() + 256];
    let r = xdp
        .test_run(TestRunOptions { data_in: Some(input), data_out: Some(&mut out), repeat, ..Default::default() })
        .expect("BPF_PROG_TEST_RUN");
    out.truncate(r.data_size_out as usize);
    Outcome { verdict: r.return_value, out, duration: r.duration }
}

pub fn flow_key(p: &Packet) -> FlowKey {
    let (src, family) = addr_key(p.src);
    let (dst, _) = addr_key(p.dst);
    FlowKey { src, dst, sport: p.sport.to_be(), dport: p.dport.to_be(), proto: p.proto, family, _pad: 0 }
}

impl Fixture {
    pub fn new(config: &str) -> Fixture {
        Fixture::with_flow_table(config, 4096)
    }

    pub fn with_flow_table(config: &str, flows: u32) -> Fixture {
        Fixture::with_object(config, flows, None)
    }

    /// As `with_flow_table`, with another build of the program (`None`: this one's).
    pub fn with_object(config: &str, flows: u32, object: Option<&[u8]>) -> Fixture {
        let cfg = Config::parse(config, "fixture.toml").expect("fixture configuration");
        let opts = LoadOptions { flow_table_size: flows, affinity_table_size: 4096, object, ..Default::default() };
        let mut ebpf = dataplane::load_dispatcher(&opts).expect("load and verify the XDP program");
        let mut tables = Tables::from_ebpf(&mut ebpf).expect("maps");
        let affinity_map = ebpf.take_map("AFFINITY").expect("AFFINITY map");
        let affinity = HashMap::try_from(affinity_map).expect("AFFINITY type");
        let states = initial_states(&cfg);
        tables.apply(&cfg, &states, &vec![0; states.len()]).expect("fill maps");
        Fixture { ebpf, tables, affinity, cfg, states }
    }

    /// Every slot of ownership table `index` owned by the dispatcher with MAC `owner`.
    pub fn steer_all(&mut self, index: u32, owner: [u8; 6]) {
        let slots = vec![SteerSlot { mac: owner, valid: 1, _pad: 0 }; STEER_SIZE as usize];
        self.tables.write_steer_table(index, &slots).expect("STEER");
    }

    /// `STEER_CONF`: the tables and flags `sel`, this dispatcher's MAC (`LB_MAC`, where the
    /// fixture's frames are addressed), and the agent's beacon (0: none).
    pub fn set_steer(&mut self, sel: u32, heartbeat_ns: u64) {
        let conf = SteerConf { sel, generation: 1, self_mac: crate::packet::LB_MAC, _pad: [0; 2], heartbeat_ns };
        self.tables.set_steer_conf(&conf).expect("STEER_CONF");
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    pub fn run_bytes(&mut self, input: &[u8]) -> Outcome {
        test_run(&mut self.ebpf, "dispatcher", input, 1)
    }

    pub fn run(&mut self, p: &Packet) -> Outcome {
        self.run_bytes(&p.build())
    }

    /// Packets counted in a STATS slot, all CPUs.
    pub fn count(&self, slot: u32) -> u64 {
        self.tables.counter(slot).expect("STATS").packets
    }

    pub fn backend_index(&self, name: &str) -> usize {
        self.cfg.backends.iter().position(|b| b.name == name).unwrap_or_else(|| panic!("no backend {name}"))
    }

    pub fn mac(&self, backend: usize) -> [u8; 6] {
        self.cfg.backends[backend].mac.expect("backend mac")
    }

    /// Sets a backend's state in BACKENDS; with `rebuild`, also rebuilds every ring as the
    /// agent does on a state change (without it, the ring still names the backend).
    pub fn set_state(&mut self, backend: usize, state: u8, rebuild: bool) {
        self.states[backend] = state;
        let info = backend_info(&self.cfg.backends[backend], state, 0);
        self.tables.set_backend(backend as u32, &info).expect("BACKENDS");
        if rebuild {
            let cfg = self.cfg.clone();
            for (i, v) in cfg.vips.iter().enumerate() {
                self.tables.rebuild_ring(i as u32, v, &cfg, &self.states).expect("RINGS");
            }
        }
    }

    /// The backend the VIP's Maglev table gives this packet's flow.
    pub fn ring_choice(&self, vip: usize, p: &Packet) -> usize {
        let ring = self.tables.ring(vip as u32).expect("ring built");
        let h = flow_hash(&flow_key(p));
        ring[(h % ring.len() as u32) as usize] as usize
    }

    /// A `CLONES` entry, as the agent writes it: `name` (clone ID or logical name) owned
    /// by `owner`, with `replica`; `failed_over`: the entry names the stand-in.
    pub fn set_clone(&mut self, name: &str, owner: usize, replica: Option<usize>, failed_over: bool) {
        self.set_clone_flags(name, owner, replica, if failed_over { CLONE_F_FAILED_OVER } else { 0 });
    }

    /// A `CLONES` entry with these flags (`CLONE_F_*`).
    pub fn set_clone_flags(&mut self, name: &str, owner: usize, replica: Option<usize>, flags: u32) {
        let mut map: HashMap<&mut MapData, u64, CloneValue> =
            HashMap::try_from(self.ebpf.map_mut("CLONES").expect("CLONES map")).expect("CLONES type");
        let v = CloneValue {
            owner: owner as u32,
            replica: replica.map(|r| r as u32).unwrap_or(NO_BACKEND),
            flags,
            _pad: 0,
        };
        map.insert(cookie_hash(name.as_bytes()), v, 0).expect("CLONES insert");
    }

    /// The backend a SIP dialog with this Call-ID is pinned to on VIP `vip`, if any.
    pub fn sip_pin(&self, vip: usize, call_id: &str) -> Option<FlowValue> {
        let key = sip_call_key(&vip_key(&self.cfg.vips[vip]), cookie_hash(call_id.as_bytes()));
        self.tables.flows.get(&key, 0).ok()
    }

    /// Where the first fragment of `p`'s datagram with IP ID `id` went (`FRAGS`), if it
    /// was recorded.
    pub fn frag_record(&mut self, p: &Packet, id: u32) -> Option<FragValue> {
        let (src, family) = addr_key(p.src);
        let (dst, _) = addr_key(p.dst);
        // The ID as the wire carries it (IPv4: 16 bits), read in memory order.
        let id = if family == dispatcher_common::AF_INET {
            u16::from_ne_bytes((id as u16).to_be_bytes()) as u32
        } else {
            u32::from_ne_bytes(id.to_be_bytes())
        };
        let key = FragKey::new(&src, &dst, id, p.proto, family);
        let map: HashMap<&MapData, FragKey, FragValue> =
            HashMap::try_from(self.ebpf.map("FRAGS").expect("FRAGS map")).expect("FRAGS type");
        map.get(&key, 0).ok()
    }

    pub fn flow(&self, p: &Packet) -> Option<FlowValue> {
        self.tables.flows.get(&flow_key(p), 0).ok()
    }

    /// The reports waiting on `SIP_LEARN`, each as its bytes.
    pub fn sip_learn_reports(&mut self) -> Vec<Vec<u8>> {
        let mut ring = aya::maps::RingBuf::try_from(self.ebpf.map_mut("SIP_LEARN").expect("SIP_LEARN map"))
            .expect("SIP_LEARN type");
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            out.push(item.to_vec());
        }
        out
    }

    /// Arms a takeover record for the packet's tuple (`TAKEOVER`, as the agent does when
    /// the connection's dispatcher died).
    pub fn arm_takeover(&mut self, p: &Packet) {
        let mut map: HashMap<_, FlowKey, dispatcher_common::TakeoverRec> =
            HashMap::try_from(self.ebpf.map_mut("TAKEOVER").expect("TAKEOVER map")).expect("TAKEOVER type");
        map.insert(flow_key(p), dispatcher_common::TakeoverRec::default(), 0).expect("TAKEOVER insert");
    }

    /// Whether the packet's tuple is armed.
    pub fn takeover_armed(&mut self, p: &Packet) -> bool {
        let map: HashMap<_, FlowKey, dispatcher_common::TakeoverRec> =
            HashMap::try_from(self.ebpf.map_mut("TAKEOVER").expect("TAKEOVER map")).expect("TAKEOVER type");
        map.get(&flow_key(p), 0).is_ok()
    }

    /// The reports waiting on `TAKEOVER_EVENTS`, each as its bytes.
    pub fn takeover_reports(&mut self) -> Vec<Vec<u8>> {
        let mut ring = aya::maps::RingBuf::try_from(self.ebpf.map_mut("TAKEOVER_EVENTS").expect("TAKEOVER_EVENTS map"))
            .expect("TAKEOVER_EVENTS type");
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            out.push(item.to_vec());
        }
        out
    }

    /// Packets counted in backend `backend`'s slot `what` (`stats::BACKEND_*`), all CPUs.
    pub fn backend_count(&self, backend: usize, what: u32) -> u64 {
        self.count(dispatcher_common::stats::backend_slot(backend as u32, what))
    }
}
