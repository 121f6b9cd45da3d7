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
        tables::{addr_key, backend_info, initial_states, Tables},
        LoadOptions,
    },
};
use dispatcher_common::{hash::flow_hash, AffinityKey, AffinityValue, FlowKey, FlowValue};

use crate::packet::Packet;

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

pub fn flow_key(p: &Packet) -> FlowKey {
    let (src, family) = addr_key(p.src);
    let (dst, _) = addr_key(p.dst);
    FlowKey { src, dst, sport: p.sport.to_be(), dport: p.dport.to_be(), proto: p.proto, family, _pad: 0 }
}

impl Fixture {
    pub fn new(config: &str) -> Fixture {
        let cfg = Config::parse(config, "fixture.toml").expect("fixture configuration");
        let opts = LoadOptions { flow_table_size: 4096, affinity_table_size: 4096, ..Default::default() };
        let mut ebpf = dataplane::load_dispatcher(&opts).expect("load and verify the XDP program");
        let mut tables = Tables::from_ebpf(&mut ebpf).expect("maps");
        let affinity_map = ebpf.take_map("AFFINITY").expect("AFFINITY map");
        let affinity = HashMap::try_from(affinity_map).expect("AFFINITY type");
        let states = initial_states(&cfg);
        tables.apply(&cfg, &states).expect("fill maps");
        Fixture { ebpf, tables, affinity, cfg, states }
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    pub fn run_bytes(&mut self, input: &[u8]) -> Outcome {
        let xdp = dataplane::program(&mut self.ebpf, "dispatcher").expect("program");
        let mut out = vec![0u8; input.len() + 256];
        let r = xdp
            .test_run(TestRunOptions {
                data_in: Some(input),
                data_out: Some(&mut out),
                repeat: 1,
                ..Default::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        out.truncate(r.data_size_out as usize);
        Outcome { verdict: r.return_value, out, duration: r.duration }
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
        let info = backend_info(&self.cfg.backends[backend], state);
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

    pub fn flow(&self, p: &Packet) -> Option<FlowValue> {
        self.tables.flows.get(&flow_key(p), 0).ok()
    }
}
