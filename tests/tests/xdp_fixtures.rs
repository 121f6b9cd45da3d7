//! Packet fixtures for the XDP program, run through BPF_PROG_TEST_RUN (needs root).
//! Each case: input packet -> expected verdict, expected output bytes, expected counters.

use dispatcher_common::{
    stats::{self, backend_slot, vip_slot},
    steer_sel, AffinityKey, AffinityValue, TakeoverEvent, STATE_DOWN, STATE_DRAIN, STATE_UP, STEER_HAS_PREV, STEER_ON,
    STEER_TAKEOVER, TAKEOVER_DATA,
};
use dispatcher_testbed::{
    fixture::{flow_key, test_run, Fixture, CONFIG, XDP_DROP, XDP_PASS, XDP_TX},
    packet::{eth, ipv4_header, ipv6_header, Packet, LB_MAC, TCP_ACK},
};

const MAC4: usize = 0;
const IPIP4: usize = 1;
const MAC6: usize = 2;
const IPIP6: usize = 3;
const STICKY_A: usize = 5;
const STICKY_B: usize = 6;

fn fixture() -> Fixture {
    Fixture::new(CONFIG)
}

/// Input frame with the MACs rewritten as MAC forwarding must do.
fn mac_forwarded(input: &[u8], backend_mac: [u8; 6]) -> Vec<u8> {
    let mut out = input.to_vec();
    out[0..6].copy_from_slice(&backend_mac);
    out[6..12].copy_from_slice(&LB_MAC);
    out
}

fn deltas(fx: &Fixture, before: &[(u32, u64)]) -> Vec<u64> {
    before.iter().map(|&(s, v)| fx.count(s) - v).collect()
}

/// Packet counts of some STATS slots, to compare after a run.
fn snapshot(fx: &Fixture, slots: &[u32]) -> Vec<(u32, u64)> {
    slots.iter().map(|&s| (s, fx.count(s))).collect()
}

#[test]
fn non_vip_traffic_passes_untouched() {
    let mut fx = fixture();
    let cases = [
        ("tcp to another host", Packet::tcp("10.0.0.2", 40000, "10.0.0.99", 80)),
        ("tcp to the VIP address on another port", Packet::tcp("10.0.0.2", 40000, "10.0.100.1", 81)),
        ("udp to a tcp VIP port", Packet::udp("10.0.0.2", 40000, "10.0.100.1", 80)),
        ("ipv6 to another host", Packet::udp("fd00::2", 40000, "fd00::99", 53)),
        (
            "truncated tcp header to a non-VIP address",
            Packet::tcp("10.0.0.2", 40000, "10.0.0.99", 80).with(|p| p.truncate = Some(14 + 20 + 10)),
        ),
        ("IHL 4 to a non-VIP address", Packet::tcp("10.0.0.2", 40000, "10.0.0.99", 80).with(|p| p.ihl = 4)),
    ];
    for (what, p) in cases {
        let before = snapshot(&fx, &[stats::PASS_NON_VIP]);
        let input = p.build();
        let o = fx.run_bytes(&input);
        assert_eq!(o.verdict, XDP_PASS, "{what}");
        assert_eq!(o.out, input, "{what}: bytes must be untouched");
        assert_eq!(deltas(&fx, &before), [1], "{what}: counted as pass_non_vip");
    }
    assert!(fx.flow(&Packet::tcp("10.0.0.2", 40000, "10.0.0.99", 80)).is_none(), "non-VIP flows are never pinned");
}

#[test]
fn non_ip_frames_pass() {
    let mut fx = fixture();
    let mut arp = eth([0xff; 6], [2, 0, 0, 0, 0, 2], 0x0806);
    arp.extend_from_slice(&[0u8; 28]);
    let mut short_vlan = eth(LB_MAC, [2, 0, 0, 0, 0, 2], 0x8100);
    short_vlan.extend_from_slice(&[0, 1]); // tag cut short
    let double_tag = Packet::tcp("10.0.0.2", 40000, "10.0.100.1", 80).with(|p| {
        p.vlan = Some(5);
        p.ethertype = Some(0x8100);
    });
    for (what, input) in [("arp", arp), ("truncated vlan tag", short_vlan), ("second vlan tag", double_tag.build())] {
        let before = snapshot(&fx, &[stats::PASS_NON_IP]);
        let o = fx.run_bytes(&input);
        assert_eq!(o.verdict, XDP_PASS, "{what}");
        assert_eq!(o.out, input, "{what}");
        assert_eq!(deltas(&fx, &before), [1], "{what}");
    }
}

#[test]
fn mac_forwarding_new_flow_then_established() {
    let mut fx = fixture();
    let syn = Packet::tcp("10.0.0.2", 40000, "10.0.100.1", 80);
    let b = fx.ring_choice(MAC4, &syn);
    let slots = [
        vip_slot(MAC4 as u32, stats::VIP_NEW_FLOWS),
        vip_slot(MAC4 as u32, stats::VIP_FLOW_HITS),
        vip_slot(MAC4 as u32, stats::VIP_PACKETS),
        backend_slot(b as u32, stats::BACKEND_PACKETS),
        backend_slot(b as u32, stats::BACKEND_NEW_FLOWS),
    ];

    let before = snapshot(&fx, &slots);
    let input = syn.build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(o.out, mac_forwarded(&input, fx.mac(b)));
    assert_eq!(deltas(&fx, &before), [1, 0, 1, 1, 1]);
    let flow = fx.flow(&syn).expect("flow pinned");
    assert_eq!(flow.backend, b as u32);
    assert_eq!(flow.vip, MAC4 as u32);

    let ack = syn.clone().with(|p| {
        p.tcp_flags = TCP_ACK;
        p.payload = b"GET / HTTP/1.1\r\n\r\n".to_vec();
    });
    let before = snapshot(&fx, &slots);
    let input = ack.build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(o.out, mac_forwarded(&input, fx.mac(b)));
    // Each forwarded packet counts once for its VIP: an established one as a flow hit.
    assert_eq!(deltas(&fx, &before), [0, 1, 0, 1, 0]);
}

#[test]
fn flow_table_wins_over_the_ring() {
    let mut fx = fixture();
    let p = Packet::tcp("10.0.0.2", 40001, "10.0.100.1", 80);
    let ring = fx.ring_choice(MAC4, &p);
    let other = (ring + 2) % 4;
    let pinned = dispatcher_common::FlowValue { backend: other as u32, vip: MAC4 as u32, cookie_hash: 0, pinned_ns: 0 };
    fx.tables.flows.insert(flow_key(&p), pinned, 0).unwrap();
    let input = p.build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(o.out, mac_forwarded(&input, fx.mac(other)), "a pinned flow stays on its backend");
}

#[test]
fn new_flows_spread_over_all_backends() {
    let mut fx = fixture();
    let mut seen = [0usize; 4];
    for i in 0..400u16 {
        let p = Packet::tcp("10.0.0.2", 20000 + i, "10.0.100.1", 80);
        let o = fx.run(&p);
        assert_eq!(o.verdict, XDP_TX);
        let b = (0..4).find(|&b| o.out[0..6] == fx.mac(b)).expect("sent to a backend");
        assert_eq!(b, fx.ring_choice(MAC4, &p), "the ring decides");
        seen[b] += 1;
    }
    for (b, n) in seen.iter().enumerate() {
        assert!((60..=140).contains(n), "backend {b} got {n} of 400 flows: {seen:?}");
    }
}

#[test]
fn down_backend_moves_pinned_flows_to_its_replica() {
    let mut fx = fixture();
    let p = Packet::tcp("10.0.0.2", 40002, "10.0.100.1", 80);
    let b = fx.ring_choice(MAC4, &p);
    assert_eq!(fx.run(&p).verdict, XDP_TX);
    let replica = fx.cfg.backends[b].replica.unwrap();

    fx.set_state(b, STATE_DOWN, false);
    let before = snapshot(&fx, &[vip_slot(MAC4 as u32, stats::VIP_REPINNED)]);
    let input = p.clone().with(|p| p.tcp_flags = TCP_ACK).build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(o.out, mac_forwarded(&input, fx.mac(replica)), "to the replica of the down backend");
    assert_eq!(deltas(&fx, &before), [1]);
    assert_eq!(fx.flow(&p).unwrap().backend, replica as u32, "flow re-pinned");

    // The original comes back: the flow stays with the replica that now has its state.
    fx.set_state(b, STATE_UP, false);
    let o = fx.run_bytes(&input);
    assert_eq!(o.out, mac_forwarded(&input, fx.mac(replica)));
}

#[test]
fn down_backend_without_live_replica_rehashes() {
    let mut fx = fixture();
    let p = Packet::tcp("10.0.0.2", 40003, "10.0.100.1", 80);
    let b = fx.ring_choice(MAC4, &p);
    assert_eq!(fx.run(&p).verdict, XDP_TX);
    let replica = fx.cfg.backends[b].replica.unwrap();
    fx.set_state(replica, STATE_DOWN, true);
    fx.set_state(b, STATE_DOWN, true);
    let o = fx.run(&p);
    assert_eq!(o.verdict, XDP_TX);
    let now = (0..4).find(|&x| o.out[0..6] == fx.mac(x)).unwrap();
    assert!(now != b && now != replica, "re-hashed onto a live backend, got {now}");
    assert_eq!(fx.flow(&p).unwrap().backend, now as u32);
}

#[test]
fn down_backend_still_in_ring_sends_new_flows_to_replica() {
    // The window between a state change and the ring rebuild.
    let mut fx = fixture();
    let p = Packet::tcp("10.0.0.2", 40004, "10.0.100.1", 80);
    let b = fx.ring_choice(MAC4, &p);
    let replica = fx.cfg.backends[b].replica.unwrap();
    fx.set_state(b, STATE_DOWN, false);
    let input = p.build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.out, mac_forwarded(&input, fx.mac(replica)));
}

#[test]
fn drained_backend_keeps_flows_takes_no_new_ones() {
    let mut fx = fixture();
    // Find a flow per backend first.
    let flows: Vec<Packet> = (0..200u16).map(|i| Packet::tcp("10.0.0.3", 30000 + i, "10.0.100.1", 80)).collect();
    let b = 0usize;
    let mine: Vec<&Packet> = flows.iter().filter(|p| fx.ring_choice(MAC4, p) == b).collect();
    assert!(!mine.is_empty());
    assert_eq!(fx.run(mine[0]).verdict, XDP_TX);

    fx.set_state(b, STATE_DRAIN, true);
    let input = mine[0].clone().with(|p| p.tcp_flags = TCP_ACK).build();
    assert_eq!(fx.run_bytes(&input).out, mac_forwarded(&input, fx.mac(b)), "existing flow kept");
    for p in &flows[100..] {
        let o = fx.run(p);
        assert_eq!(o.verdict, XDP_TX);
        assert_ne!(o.out[0..6], fx.mac(b), "no new flow to a drained backend");
    }
}

#[test]
fn drained_backend_still_in_ring_is_skipped() {
    let mut fx = fixture();
    let p = Packet::tcp("10.0.0.2", 40005, "10.0.100.1", 80);
    let b = fx.ring_choice(MAC4, &p);
    fx.set_state(b, STATE_DRAIN, false);
    let o = fx.run(&p);
    assert_eq!(o.verdict, XDP_TX);
    assert_ne!(o.out[0..6], fx.mac(b));
}

#[test]
fn no_backend_left_drops_and_counts() {
    let mut fx = fixture();
    for b in 0..4 {
        fx.set_state(b, STATE_DOWN, true);
    }
    let before = snapshot(&fx, &[stats::DROP_NO_BACKEND, vip_slot(MAC4 as u32, stats::VIP_DROPS)]);
    let o = fx.run(&Packet::tcp("10.0.0.2", 40006, "10.0.100.1", 80));
    assert_eq!(o.verdict, XDP_DROP);
    assert_eq!(deltas(&fx, &before), [1, 1]);
}

#[test]
fn ipip_v4_encapsulation() {
    let mut fx = fixture();
    let p = Packet::tcp("10.0.0.2", 40007, "10.0.100.2", 80).with(|p| {
        p.tos = 0x28;
        p.payload = b"hello".to_vec();
    });
    let b = fx.ring_choice(IPIP4, &p);
    let inner = p.ip_packet();
    let o = fx.run(&p);
    assert_eq!(o.verdict, XDP_TX);
    let mut expected = eth(fx.mac(b), LB_MAC, 0x0800);
    expected.extend(ipv4_header(
        "10.0.0.1".parse().unwrap(),
        fx.cfg.backends[b].address,
        4,
        0x28,
        (20 + inner.len()) as u16,
        0,
    ));
    expected.extend(&inner);
    assert_eq!(o.out, expected);
}

#[test]
fn ipip_v6_encapsulation() {
    let mut fx = fixture();
    let p = Packet::tcp("fd00::2", 40008, "fd00::200", 443).with(|p| p.payload = b"x".to_vec());
    let b = fx.ring_choice(IPIP6, &p);
    let inner = p.ip_packet();
    let o = fx.run(&p);
    assert_eq!(o.verdict, XDP_TX);
    let mut expected = eth(fx.mac(b), LB_MAC, 0x86dd);
    expected.extend(ipv6_header(
        "fd00::1".parse().unwrap(),
        fx.cfg.backends[b].address6.unwrap(),
        41,
        inner.len() as u16,
    ));
    expected.extend(&inner);
    assert_eq!(o.out, expected);
}

#[test]
fn mac_forwarding_ipv6_udp() {
    let mut fx = fixture();
    let p = Packet::udp("fd00::2", 5353, "fd00::100", 53).with(|p| p.payload = b"query".to_vec());
    let b = fx.ring_choice(MAC6, &p);
    let input = p.build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(o.out, mac_forwarded(&input, fx.mac(b)));
}

#[test]
fn vlan_tag_is_kept() {
    let mut fx = fixture();
    let p = Packet::tcp("10.0.0.2", 40009, "10.0.100.1", 80).with(|p| p.vlan = Some(42));
    let b = fx.ring_choice(MAC4, &p);
    let input = p.build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(o.out, mac_forwarded(&input, fx.mac(b)));

    let p = Packet::tcp("10.0.0.2", 40010, "10.0.100.2", 80).with(|p| p.vlan = Some(42));
    let b = fx.ring_choice(IPIP4, &p);
    let inner = p.ip_packet();
    let o = fx.run(&p);
    assert_eq!(o.verdict, XDP_TX);
    let mut expected = eth(fx.mac(b), LB_MAC, 0x8100);
    expected.extend_from_slice(&[0, 42, 0x08, 0x00]);
    expected.extend(ipv4_header(
        "10.0.0.1".parse().unwrap(),
        fx.cfg.backends[b].address,
        4,
        0,
        (20 + inner.len()) as u16,
        0,
    ));
    expected.extend(&inner);
    assert_eq!(o.out, expected);
}

#[test]
fn http_vip_goes_to_the_host_stack() {
    let mut fx = fixture();
    let before = snapshot(&fx, &[stats::PASS_HTTP]);
    let p = Packet::tcp("10.0.0.2", 40011, "10.0.100.3", 80);
    let input = p.build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_PASS);
    assert_eq!(o.out, input);
    assert_eq!(deltas(&fx, &before), [1]);
    assert!(fx.flow(&p).is_none(), "the agent, not XDP, owns HTTP connections");
}

#[test]
fn source_ip_affinity_and_cross_port() {
    let mut fx = fixture();
    let first = Packet::tcp("10.0.0.7", 41000, "10.0.100.4", 80);
    let o = fx.run(&first);
    let b = (0..4).find(|&x| o.out[0..6] == fx.mac(x)).unwrap();
    // Other source ports and the other port of the group follow the client's affinity,
    // whatever the ring would say.
    let mut differs = 0;
    for i in 1..40u16 {
        let p = Packet::tcp("10.0.0.7", 41000 + i, "10.0.100.4", if i % 2 == 0 { 80 } else { 443 });
        let vip = if i % 2 == 0 { STICKY_A } else { STICKY_B };
        if fx.ring_choice(vip, &p) != b {
            differs += 1;
        }
        let before = snapshot(&fx, &[vip_slot(vip as u32, stats::VIP_AFFINITY_HITS)]);
        let o = fx.run(&p);
        assert_eq!(o.out[0..6], fx.mac(b), "flow {i} follows the client's affinity");
        assert_eq!(deltas(&fx, &before), [1]);
    }
    assert!(differs > 10, "the test must cover flows the ring would send elsewhere");
}

#[test]
fn expired_affinity_is_ignored() {
    let mut fx = fixture();
    let p = Packet::tcp("10.0.0.8", 42000, "10.0.100.4", 80);
    let ring = fx.ring_choice(STICKY_A, &p);
    let other = (ring + 1) % 4;
    let group = fx.cfg.vips[STICKY_A].l4().expect("an L4 VIP").port_group;
    let key = AffinityKey { group, family: 2, client: flow_key(&p).src };
    fx.affinity.insert(key, AffinityValue { backend: other as u32, _pad: 0, expires_ns: 1 }, 0).unwrap();
    let o = fx.run(&p);
    assert_eq!(o.out[0..6], fx.mac(ring), "expired entry: the ring decides");
    let renewed = fx.affinity.get(&key, 0).unwrap();
    assert_eq!(renewed.backend, ring as u32, "affinity renewed to the new choice");

    let p2 = Packet::tcp("10.0.0.8", 42001, "10.0.100.4", 80);
    fx.affinity.insert(key, AffinityValue { backend: other as u32, _pad: 0, expires_ns: u64::MAX }, 0).unwrap();
    assert_eq!(fx.run(&p2).out[0..6], fx.mac(other), "live entry wins over the ring");
}

#[test]
fn malformed_vip_traffic_gets_a_defined_counted_verdict() {
    let vip = || Packet::tcp("10.0.0.2", 40012, "10.0.100.1", 80);
    let cases: Vec<(&str, Packet, u32, u32)> = vec![
        ("truncated tcp header", vip().with(|p| p.truncate = Some(14 + 20 + 12)), XDP_DROP, stats::DROP_TRUNCATED),
        (
            "truncated udp header",
            Packet::udp("fd00::2", 1, "fd00::100", 53).with(|p| p.truncate = Some(14 + 40 + 4)),
            XDP_DROP,
            stats::DROP_TRUNCATED,
        ),
        ("IHL below 5", vip().with(|p| p.ihl = 4), XDP_DROP, stats::DROP_BAD_IHL),
        ("IP version 5 in an IPv4 frame", vip().with(|p| p.ip_version = Some(5)), XDP_DROP, stats::DROP_BAD_VERSION),
        ("TCP data offset below 5", vip().with(|p| p.tcp_doff = 4), XDP_DROP, stats::DROP_BAD_TCP_DOFF),
        ("IPv4 options", vip().with(|p| p.ihl = 6), XDP_PASS, stats::PASS_IP_OPTIONS),
        ("first fragment (MF)", vip().with(|p| p.frag_off = 0x2000), XDP_PASS, stats::PASS_FRAGMENT),
        ("later fragment", vip().with(|p| p.frag_off = 0x0010), XDP_PASS, stats::PASS_FRAGMENT),
        (
            "IPv6 hop-by-hop header",
            Packet::udp("fd00::2", 1, "fd00::100", 53).with(|p| p.proto = 0),
            XDP_PASS,
            stats::PASS_IPV6_EXT,
        ),
        ("truncated IPv4 header", vip().with(|p| p.truncate = Some(14 + 12)), XDP_PASS, stats::PASS_NON_VIP),
        ("IPv4 total length 0", vip().with(|p| p.ip_len = Some(0)), XDP_DROP, stats::DROP_BAD_LENGTH),
        ("IPv4 total length 20 (no TCP header)", vip().with(|p| p.ip_len = Some(20)), XDP_DROP, stats::DROP_BAD_LENGTH),
        ("IPv4 total length 65535", vip().with(|p| p.ip_len = Some(65535)), XDP_DROP, stats::DROP_BAD_LENGTH),
        (
            "IPv6 payload length beyond the frame",
            Packet::udp("fd00::2", 1, "fd00::100", 53).with(|p| p.ip_len = Some(65535)),
            XDP_DROP,
            stats::DROP_BAD_LENGTH,
        ),
        ("broadcast destination MAC", vip().with(|p| p.eth_dst = [0xff; 6]), XDP_DROP, stats::DROP_GROUP_MAC),
        (
            "multicast destination MAC",
            vip().with(|p| p.eth_dst = [0x01, 0x00, 0x5e, 0, 0, 1]),
            XDP_DROP,
            stats::DROP_GROUP_MAC,
        ),
        ("source 127.0.0.1", Packet::tcp("127.0.0.1", 1, "10.0.100.1", 80), XDP_DROP, stats::DROP_MARTIAN),
        ("source 0.0.0.5", Packet::tcp("0.0.0.5", 1, "10.0.100.1", 80), XDP_DROP, stats::DROP_MARTIAN),
        ("source 224.0.0.1", Packet::tcp("224.0.0.1", 1, "10.0.100.1", 80), XDP_DROP, stats::DROP_MARTIAN),
        ("source 255.255.255.255", Packet::tcp("255.255.255.255", 1, "10.0.100.1", 80), XDP_DROP, stats::DROP_MARTIAN),
        ("source ::1", Packet::udp("::1", 1, "fd00::100", 53), XDP_DROP, stats::DROP_MARTIAN),
        ("source ff02::1", Packet::udp("ff02::1", 1, "fd00::100", 53), XDP_DROP, stats::DROP_MARTIAN),
        (
            "ICMPv6 to a VIP address is not an extension header",
            Packet::udp("fd00::2", 1, "fd00::100", 53).with(|p| p.proto = 58),
            XDP_PASS,
            stats::PASS_NON_VIP,
        ),
    ];
    let mut fx = fixture();
    for (what, p, verdict, slot) in cases {
        // The VIP the packet is for (its address marker's for packets whose ports are
        // unreadable): every malformed drop counts on it too.
        let vip_id = if p.dst.is_ipv4() { MAC4 } else { MAC6 } as u32;
        let before = snapshot(&fx, &[slot, vip_slot(vip_id, stats::VIP_DROPS)]);
        let input = p.build();
        let o = fx.run_bytes(&input);
        assert_eq!(o.verdict, verdict, "{what}");
        assert_eq!(o.out, input, "{what}: never rewritten");
        let vip_drops = u64::from(verdict == XDP_DROP);
        assert_eq!(deltas(&fx, &before), [1, vip_drops], "{what}: counted, and on the VIP when dropped");
        assert!(fx.flow(&p).is_none(), "{what}: never pinned");
    }
}

/// Legitimate traffic is not caught by the checks: Ethernet padding after a short IP
/// packet, and a source that merely looks unusual.
#[test]
fn padded_frames_and_ordinary_sources_are_forwarded() {
    let mut fx = fixture();
    let mut input = Packet::tcp("10.0.0.2", 40100, "10.0.100.1", 80).build();
    input.extend_from_slice(&[0u8; 6]); // a 54-byte frame padded to the 60-byte minimum
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX, "padding beyond the IP length is fine");
    for src in ["10.0.0.2", "192.0.2.9", "126.255.255.255", "223.255.255.254"] {
        let o = fx.run(&Packet::tcp(src, 40101, "10.0.100.1", 80));
        assert_eq!(o.verdict, XDP_TX, "{src}");
    }
}

#[test]
fn decap_strips_the_outer_header() {
    let mut ebpf = dispatcher::dataplane::load_decap().expect("load decap");
    let mut run = |input: &[u8]| {
        let o = test_run(&mut ebpf, "decap", input, 1);
        (o.verdict, o.out)
    };
    let inner = Packet::tcp("10.0.0.2", 40013, "10.0.100.2", 80);
    let inner_ip = inner.ip_packet();
    let mut v4 = eth([2, 0, 0, 0, 1, 0], LB_MAC, 0x0800);
    v4.extend(ipv4_header(
        "10.0.0.1".parse().unwrap(),
        "10.0.0.10".parse().unwrap(),
        4,
        0,
        (20 + inner_ip.len()) as u16,
        0,
    ));
    v4.extend(&inner_ip);
    let (verdict, out) = run(&v4);
    assert_eq!(verdict, XDP_PASS);
    let mut expected = eth([2, 0, 0, 0, 1, 0], LB_MAC, 0x0800);
    expected.extend(&inner_ip);
    assert_eq!(out, expected);

    let inner6 = Packet::tcp("fd00::2", 40014, "fd00::200", 443).ip_packet();
    let mut v6 = eth([2, 0, 0, 0, 1, 0], LB_MAC, 0x86dd);
    v6.extend(ipv6_header("fd00::1".parse().unwrap(), "fd00::10".parse().unwrap(), 41, inner6.len() as u16));
    v6.extend(&inner6);
    let (verdict, out) = run(&v6);
    assert_eq!(verdict, XDP_PASS);
    let mut expected = eth([2, 0, 0, 0, 1, 0], LB_MAC, 0x86dd);
    expected.extend(&inner6);
    assert_eq!(out, expected);

    let plain = Packet::tcp("10.0.0.2", 40015, "10.0.0.10", 22).build();
    assert_eq!(run(&plain), (XDP_PASS, plain.clone()), "non-IPIP traffic untouched");
}

/// A client reusing a port: a SYN on a tuple pinned to a drained backend is a new
/// connection and goes where new connections go; the old flow's other packets kept
/// their backend until then.
#[test]
fn a_syn_reusing_a_tuple_pinned_to_a_drained_backend_is_chosen_afresh() {
    let mut fx = fixture();
    let flows: Vec<Packet> = (0..200u16).map(|i| Packet::tcp("10.0.0.4", 31000 + i, "10.0.100.1", 80)).collect();
    let b = 1usize;
    let p = flows.iter().find(|p| fx.ring_choice(MAC4, p) == b).expect("a flow on backend 1").clone();
    assert_eq!(fx.run(&p).out[0..6], fx.mac(b));
    fx.set_state(b, STATE_DRAIN, true);

    let ack = p.clone().with(|p| p.tcp_flags = TCP_ACK).build();
    assert_eq!(fx.run_bytes(&ack).out, mac_forwarded(&ack, fx.mac(b)), "the old flow's packets stay");
    let before = snapshot(&fx, &[vip_slot(MAC4 as u32, stats::VIP_NEW_FLOWS)]);
    let syn = p.build();
    let o = fx.run_bytes(&syn);
    assert_eq!(o.verdict, XDP_TX);
    assert_ne!(o.out[0..6], fx.mac(b), "a new connection never goes to a drained backend");
    let now = (0..4).find(|&x| o.out[0..6] == fx.mac(x)).unwrap();
    assert_eq!(fx.flow(&p).unwrap().backend, now as u32, "the tuple is pinned anew");
    assert_eq!(deltas(&fx, &before), [1], "counted as a new flow");
    // While up, a SYN on a pinned tuple keeps it (a retransmitted SYN stays put).
    fx.set_state(b, STATE_UP, true);
    assert_eq!(fx.run_bytes(&syn).out[0..6], fx.mac(now));
}

// ---- Connection steering (HTTP VIPs shared by several dispatchers) ----

const PEER_A: [u8; 6] = [0x02, 0x99, 0, 0, 1, 0x0a];
const PEER_B: [u8; 6] = [0x02, 0x99, 0, 0, 1, 0x0b];

fn steer_conf(fx: &mut Fixture, cur: u32, prev: Option<u32>) {
    let flags = STEER_ON | if prev.is_some() { STEER_HAS_PREV } else { 0 };
    fx.set_steer(steer_sel(cur, prev.unwrap_or(0), flags), 0);
}

/// The frame as steering sends it on: MACs rewritten, TTL one less, checksum still right.
fn steered(input: &[u8], to: [u8; 6]) -> Vec<u8> {
    let mut out = input.to_vec();
    out[0..6].copy_from_slice(&to);
    out[6..12].copy_from_slice(&LB_MAC);
    out[14 + 8] -= 1;
    out[24..26].copy_from_slice(&[0, 0]);
    let c = dispatcher_testbed::packet::csum(&out[14..34]);
    out[24..26].copy_from_slice(&c.to_be_bytes());
    out
}

#[test]
fn steering_sends_a_connection_to_its_owner_and_keeps_its_own() {
    let mut fx = fixture();
    let syn = Packet::tcp("10.0.0.2", 40100, "10.0.100.3", 80);
    // Steering off (no STEER_CONF): the host stack takes it, as before.
    assert_eq!(fx.run(&syn).verdict, XDP_PASS);

    fx.steer_all(0, PEER_A);
    steer_conf(&mut fx, 0, None);
    let before = snapshot(&fx, &[stats::STEERED, stats::PASS_HTTP]);
    let input = syn.build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX, "another dispatcher owns it");
    assert_eq!(o.out, steered(&input, PEER_A));
    assert_eq!(dispatcher_testbed::packet::csum(&o.out[14..34]), 0, "a valid IPv4 header checksum");
    assert_eq!(deltas(&fx, &before), [1, 0]);

    // The owner itself sent it here (its second chance, or tables that differ a moment):
    // it stays, never back.
    let from_owner = syn.clone().with(|p| p.eth_src = PEER_A);
    let before = snapshot(&fx, &[stats::STEER_KEPT_LOCAL, stats::PASS_HTTP]);
    assert_eq!(fx.run(&from_owner).verdict, XDP_PASS);
    assert_eq!(deltas(&fx, &before), [1, 1]);

    // Owned here: passed.
    fx.steer_all(1, LB_MAC);
    steer_conf(&mut fx, 1, None);
    let o = fx.run_bytes(&input);
    assert_eq!((o.verdict, o.out == input), (XDP_PASS, true));
}

#[test]
fn second_chance_goes_to_the_previous_owner_for_packets_of_no_local_connection() {
    let mut fx = fixture();
    // Now ours (table 1), before PEER_B's (table 2).
    fx.steer_all(1, LB_MAC);
    fx.steer_all(2, PEER_B);
    steer_conf(&mut fx, 1, Some(2));
    let ack = Packet::tcp("10.0.0.2", 40200, "10.0.100.3", 80).with(|p| p.tcp_flags = TCP_ACK);
    let input = ack.build();
    let before = snapshot(&fx, &[stats::STEER_SECOND_CHANCE]);
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX, "no socket here for it: the previous owner has it");
    assert_eq!(o.out, steered(&input, PEER_B));
    assert_eq!(deltas(&fx, &before), [1]);

    // A SYN is a new connection: the current owner (here) takes it.
    let syn = Packet::tcp("10.0.0.2", 40201, "10.0.100.3", 80);
    assert_eq!(fx.run(&syn).verdict, XDP_PASS);
    // Sent here by the previous owner (it had no socket either): it stays, no ping-pong.
    let back = ack.clone().with(|p| p.eth_src = PEER_B);
    assert_eq!(fx.run(&back).verdict, XDP_PASS);

    // Without the previous table (second chance over): the current owner keeps it.
    steer_conf(&mut fx, 1, None);
    assert_eq!(fx.run_bytes(&input).verdict, XDP_PASS);
}

#[test]
fn a_dead_dispatchers_armed_connection_is_reported_and_dropped_before_the_second_chance() {
    let mut fx = fixture();
    // Ours now (table 1); the previous table (2) names the dead dispatcher.
    fx.steer_all(1, LB_MAC);
    fx.steer_all(2, PEER_B);
    let sel = steer_sel(1, 2, STEER_ON | STEER_HAS_PREV | STEER_TAKEOVER);
    fx.set_steer(sel, 0);
    let request = b"GET /app HTTP/1.1\r\nHost: v\r\n\r\n".to_vec();
    let seg = Packet::tcp("10.0.0.2", 40400, "10.0.100.3", 80).with(|p| {
        p.tcp_flags = TCP_ACK;
        p.tcp_doff = 8; // 12 bytes of options (NOPs)
        p.payload = request.clone();
    });
    fx.arm_takeover(&seg);
    let before = snapshot(&fx, &[stats::TAKEOVER_REPORTED, stats::TAKEOVER_DROPPED, stats::STEER_SECOND_CHANCE]);
    let input = seg.build();
    assert_eq!(fx.run_bytes(&input).verdict, XDP_DROP, "reported and dropped, never sent to the dead one");
    let reports = fx.takeover_reports();
    assert_eq!(reports.len(), 1);
    // SAFETY: the ring's record is a whole `TakeoverEvent` (its length checked).
    assert_eq!(reports[0].len(), std::mem::size_of::<TakeoverEvent>());
    let e: TakeoverEvent = unsafe { std::ptr::read_unaligned(reports[0].as_ptr().cast()) };
    assert_eq!((e.key.sport, e.key.dport, e.key.src), (flow_key(&seg).sport, flow_key(&seg).dport, flow_key(&seg).src));
    assert_eq!((e.header_len, e.segment_len as usize), (32, 32 + request.len()), "its header and its length");
    let tcp_at = 14 + 20;
    assert_eq!(&e.tcp[..32], &input[tcp_at..tcp_at + 32], "the TCP header as it is (sequence, ack, window, options)");
    assert_eq!(&e.data[..e.data_len as usize], &request[..], "the segment's data, for the rebuilt socket");
    // Its retransmission within 50 ms: dropped, not reported again.
    assert_eq!(fx.run_bytes(&input).verdict, XDP_DROP);
    assert!(fx.takeover_reports().is_empty());
    assert_eq!(deltas(&fx, &before), [1, 1, 0]);

    // A SYN with the tuple is a new connection: the record is stale, deleted; it stays here.
    let syn = Packet::tcp("10.0.0.2", 40400, "10.0.100.3", 80);
    assert_eq!(fx.run(&syn).verdict, XDP_PASS);
    assert!(!fx.takeover_armed(&seg), "the SYN deleted the record");
    // Without a record: the second chance as before.
    assert_eq!(fx.run_bytes(&input).verdict, XDP_TX);

    // Data longer than a report holds: reported without it (the client retransmits it).
    let long = Packet::tcp("10.0.0.2", 40401, "10.0.100.3", 80).with(|p| {
        p.tcp_flags = TCP_ACK;
        p.payload = vec![b'x'; TAKEOVER_DATA + 1];
    });
    fx.arm_takeover(&long);
    assert_eq!(fx.run(&long).verdict, XDP_DROP);
    let reports = fx.takeover_reports();
    let e: TakeoverEvent = unsafe { std::ptr::read_unaligned(reports[0].as_ptr().cast()) };
    assert_eq!((e.segment_len as usize, e.data_len), (20 + TAKEOVER_DATA + 1, 0));
    // The longest that fits: all of it.
    let full = Packet::tcp("10.0.0.2", 40402, "10.0.100.3", 80).with(|p| {
        p.tcp_flags = TCP_ACK | 0x08;
        p.payload = (0..TAKEOVER_DATA).map(|i| i as u8).collect();
    });
    fx.arm_takeover(&full);
    assert_eq!(fx.run(&full).verdict, XDP_DROP);
    let reports = fx.takeover_reports();
    let e: TakeoverEvent = unsafe { std::ptr::read_unaligned(reports[0].as_ptr().cast()) };
    assert_eq!(e.data_len as usize, TAKEOVER_DATA);
    assert!(e.data.iter().enumerate().all(|(i, &b)| b == i as u8), "all of it, in order");

    // Armed, but the flag off (nothing armed as far as the agent said): not looked up.
    fx.arm_takeover(&seg);
    steer_conf(&mut fx, 1, Some(2));
    assert_eq!(fx.run_bytes(&input).verdict, XDP_TX);
    // Another dispatcher's slot: sent on to its owner, not reported.
    fx.steer_all(1, PEER_A);
    fx.set_steer(sel, 0);
    let o = fx.run_bytes(&input);
    assert_eq!((o.verdict, &o.out[0..6]), (XDP_TX, PEER_A.as_slice()));
    assert!(fx.takeover_reports().is_empty());
}

#[test]
fn a_packet_with_no_ttl_left_is_not_steered() {
    let mut fx = fixture();
    fx.steer_all(0, PEER_A);
    steer_conf(&mut fx, 0, None);
    let mut input = Packet::tcp("10.0.0.2", 40300, "10.0.100.3", 80).build();
    input[14 + 8] = 1;
    input[24..26].copy_from_slice(&[0, 0]);
    let c = dispatcher_testbed::packet::csum(&input[14..34]);
    input[24..26].copy_from_slice(&c.to_be_bytes());
    let before = snapshot(&fx, &[stats::STEER_TTL_EXPIRED]);
    let o = fx.run_bytes(&input);
    assert_eq!((o.verdict, o.out == input), (XDP_PASS, true));
    assert_eq!(deltas(&fx, &before), [1]);
    // L4 VIPs are never steered: Maglev gives the same backend on every dispatcher.
    let l4 = Packet::tcp("10.0.0.2", 40301, "10.0.100.1", 80).build();
    let o = fx.run_bytes(&l4);
    assert_ne!(&o.out[0..6], PEER_A.as_slice());
}

#[test]
fn with_the_agent_gone_what_this_host_owned_goes_by_the_fallback_table() {
    let mut fx = fixture();
    fx.steer_all(0, LB_MAC);
    fx.steer_all(dispatcher_common::STEER_FALLBACK, PEER_A);
    let input = Packet::tcp("10.0.0.2", 40400, "10.0.100.3", 80).build();
    let now = dispatcher::steering::monotonic_ns();
    let conf = |fx: &mut Fixture, heartbeat_ns: u64| fx.set_steer(steer_sel(0, 0, STEER_ON), heartbeat_ns);
    // A fresh beacon (or none at all): ours, kept.
    conf(&mut fx, now);
    assert_eq!(fx.run_bytes(&input).verdict, XDP_PASS);
    conf(&mut fx, 0);
    assert_eq!(fx.run_bytes(&input).verdict, XDP_PASS);
    // The beacon is 2 s old: no agent here; to the owner without this host.
    conf(&mut fx, now.saturating_sub(2_000_000_000));
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(o.out, steered(&input, PEER_A));
}

#[test]
fn two_changes_in_a_row_the_older_owner_still_gets_its_connections() {
    let mut fx = fixture();
    // Ours now and under the previous table; PEER_B's the table before.
    fx.steer_all(0, LB_MAC);
    fx.steer_all(1, LB_MAC);
    fx.steer_all(2, PEER_B);
    let sel = dispatcher_common::steer_sel3(0, 1, 2, STEER_ON | STEER_HAS_PREV | dispatcher_common::STEER_HAS_PREV2);
    fx.set_steer(sel, 0);
    let input = Packet::tcp("10.0.0.2", 40500, "10.0.100.3", 80).with(|p| p.tcp_flags = TCP_ACK).build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(o.out, steered(&input, PEER_B));
}

#[test]
fn a_dispatcher_that_left_drops_what_a_lagging_owner_sends_rather_than_reset_it() {
    let mut fx = fixture();
    fx.steer_all(0, PEER_A);
    let from_owner = Packet::tcp("10.0.0.2", 40600, "10.0.100.3", 80).with(|p| p.eth_src = PEER_A);
    let conf = |fx: &mut Fixture, flags: u32| fx.set_steer(steer_sel(0, 0, STEER_ON | flags), 0);
    conf(&mut fx, 0);
    assert_eq!(fx.run(&from_owner).verdict, XDP_PASS, "joined: the owner's second chance is kept");
    conf(&mut fx, dispatcher_common::STEER_LEFT);
    let before = snapshot(&fx, &[stats::STEER_DROPPED_LEFT]);
    assert_eq!(fx.run(&from_owner).verdict, XDP_DROP, "left, no connection here: dropped (TCP retransmits)");
    assert_eq!(deltas(&fx, &before), [1]);
}
