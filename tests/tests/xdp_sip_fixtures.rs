//! SIP VIP fixtures for the XDP program (BPF_PROG_TEST_RUN, needs root): every affinity
//! form, the owner's states, unknown names, and malformed input, each with its verdict,
//! output bytes and counters; UDP datagrams in IP fragments on SIP and L4 VIPs.

use dispatcher_common::{
    hash::cookie_hash,
    sip::{SIP_SCAN_MAX, SRC_CALL_ID, SRC_FROM_TAG, SRC_ROUTE, SRC_TO_TAG, SRC_VIA},
    stats::{self, vip_sip_source, vip_slot},
    CLONE_F_LEARNED, FRAG_BUDGET_PER_SEC, NO_BACKEND, STATE_DOWN, STATE_SUSPECT, STATE_UP,
};
use dispatcher_testbed::{
    fixture::{Fixture, CONFIG, XDP_DROP, XDP_PASS, XDP_TX},
    packet::{Packet, LB_MAC},
};

const SIP: usize = 7;
const VIP: &str = "10.0.100.5";
const B0: usize = 0;
const B1: usize = 1;

fn sip_packet(sport: u16, msg: &str) -> Packet {
    Packet::udp("10.0.0.2", sport, VIP, 5060).with(|p| p.payload = msg.as_bytes().to_vec())
}

fn invite(call_id: &str) -> String {
    format!(
        "INVITE sip:service@{VIP}:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2:5061;branch=z9hG4bK-{call_id}\r\nFrom: sipp <sip:sipp@10.0.0.2:5061>;tag=77\r\nTo: sut <sip:service@{VIP}:5060>\r\nCall-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: <sip:sipp@10.0.0.2:5061>\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
}

/// Which backend a forwarded frame went to (by destination MAC), checking the rewrite.
fn sent_to(fx: &Fixture, input: &[u8], out: &[u8]) -> usize {
    assert_eq!(&out[6..12], &LB_MAC, "source MAC is the dispatcher's");
    assert_eq!(&out[12..], &input[12..], "only the MACs change");
    (0..fx.cfg.backends.len()).find(|&b| out[0..6] == fx.mac(b)).expect("sent to a backend's MAC")
}

fn count(fx: &Fixture, what: u32) -> u64 {
    fx.count(vip_slot(SIP as u32, what))
}

#[test]
fn a_message_without_affinity_goes_by_its_call_id_and_pins_the_dialog() {
    let mut fx = Fixture::new(CONFIG);
    let mut used = std::collections::HashSet::new();
    for i in 0..24 {
        let call_id = format!("{i}-call@10.0.0.2");
        let input = sip_packet(5061, &invite(&call_id)).build();
        let o = fx.run_bytes(&input);
        assert_eq!(o.verdict, XDP_TX, "{call_id}");
        let first = sent_to(&fx, &input, &o.out);
        used.insert(first);
        let pin = fx.sip_pin(SIP, &call_id).expect("the dialog is pinned by its Call-ID");
        assert_eq!(pin.backend as usize, first);
        assert_eq!(pin.cookie_hash, cookie_hash(call_id.as_bytes()), "the pin records the Call-ID's hash");
        // A retransmission from another source port, and a later request of the dialog
        // with no affinity ID: the same container.
        let again = sip_packet(40000 + i, &invite(&call_id).replacen("INVITE sip", "INFO sip", 1)).build();
        let o = fx.run_bytes(&again);
        assert_eq!(o.verdict, XDP_TX);
        assert_eq!(sent_to(&fx, &again, &o.out), first, "{call_id}: whatever the source port");
    }
    assert!(used.len() >= 3, "Call-IDs spread over the containers: {used:?}");
    assert_eq!(count(&fx, vip_sip_source(SRC_CALL_ID)), 48);
    // Each message counts once: the 24 that began a dialog, the 24 that followed its pin.
    assert_eq!(count(&fx, stats::VIP_PACKETS), 24);
    assert_eq!(count(&fx, stats::VIP_FLOW_HITS), 24);
}

#[test]
fn every_affinity_form_reaches_the_logical_names_owner() {
    let mut fx = Fixture::new(CONFIG);
    fx.set_clone("lnA", B0, Some(B1), false);
    fx.set_clone("other", 3, Some(2), false);
    let cases: [(&str, u8, String); 7] = [
        (
            "Route ibmsid",
            SRC_ROUTE,
            "BYE sip:service@h SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2:5061;branch=z9\r\nRoute: <sip:10.0.100.5:5060;transport=udp;ibmsid=lnA.1138119214953.4_2_2;lr>\r\nTo: <sip:a@b>;tag=other.1_2_3\r\nCall-ID: route-1\r\n\r\n".into(),
        ),
        ("To tag", SRC_TO_TAG, "ACK sip:x@h SIP/2.0\r\nTo: <sip:a@b>;tag=lnA.1132518053302_2_2\r\nFrom: <sip:c@d>;tag=1\r\nCall-ID: to-1\r\n\r\n".into()),
        ("compact t:, upper case, bare LF", SRC_TO_TAG, "ACK sip:x@h SIP/2.0\nT : <sip:a@b> ; TAG = lnA.1_2_2\ni: to-2\n\n".into()),
        ("From tag (UAC application)", SRC_FROM_TAG, "BYE sip:x@h SIP/2.0\r\nf: <sip:c@d>;tag=lnA.1153242645968_1_1\r\nt: <sip:a@b>;tag=9f8e\r\nCall-ID: from-1\r\n\r\n".into()),
        ("folded Route", SRC_ROUTE, "BYE sip:x@h SIP/2.0\r\nRoute: <sip:p1;lr>,\r\n\t<sip:p2;lr;IBMSID=lnA.1_2_3>\r\nCall-ID: fold-1\r\n\r\n".into()),
        ("response by its top Via", SRC_VIA, "SIP/2.0 200 OK\r\nv: SIP/2.0/UDP 10.0.100.5:5060;ibmsid=lnA.1153242645968.4_2_2;branch=z9\r\nVia: SIP/2.0/UDP 10.0.0.2;ibmsid=other.1_2_3\r\nFrom: <sip:c@d>;tag=other.1_2_3\r\nCall-ID: via-1\r\n\r\n".into()),
        ("response without Via ibmsid: From tag", SRC_FROM_TAG, "SIP/2.0 180 Ringing\r\nVia: SIP/2.0/UDP 10.0.0.2;branch=z9\r\nFrom: <sip:c@d>;tag=lnA.1_2_3\r\nTo: <sip:a@b>;tag=other.1_2_3\r\nCall-ID: via-2\r\n\r\n".into()),
    ];
    for (what, src, msg) in &cases {
        let before = count(&fx, vip_sip_source(*src));
        let input = sip_packet(5061, msg).build();
        let o = fx.run_bytes(&input);
        assert_eq!(o.verdict, XDP_TX, "{what}");
        assert_eq!(sent_to(&fx, &input, &o.out), B0, "{what}");
        assert_eq!(count(&fx, vip_sip_source(*src)) - before, 1, "{what}: counted by its source");
    }
    assert_eq!(fx.sip_pin(SIP, "to-1"), None, "a message with a logical name pins nothing");
}

#[test]
fn a_suspect_owner_holds_a_down_one_fails_over_to_its_replica() {
    let mut fx = Fixture::new(CONFIG);
    fx.set_clone("lnA", B0, Some(B1), false);
    let bye = "BYE sip:x@h SIP/2.0\r\nTo: <sip:a@b>;tag=lnA.1_2_2\r\nCall-ID: c1\r\n\r\n";
    let input = sip_packet(5061, bye).build();

    fx.set_state(B0, STATE_SUSPECT, true);
    let (held, drops) = (count(&fx, stats::VIP_SIP_HELD), fx.count(stats::DROP_SIP_HELD));
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_DROP, "never to another container while the owner may be alive");
    assert_eq!(count(&fx, stats::VIP_SIP_HELD) - held, 1);
    assert_eq!(fx.count(stats::DROP_SIP_HELD) - drops, 1);

    // Down, the entry not rewritten yet: the replica named in it.
    fx.set_state(B0, STATE_DOWN, true);
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(sent_to(&fx, &input, &o.out), B1);
    // Rewritten by the agent (the stand-in first).
    fx.set_clone("lnA", B1, Some(B0), true);
    let o = fx.run_bytes(&input);
    assert_eq!(sent_to(&fx, &input, &o.out), B1);
    // The replica suspect too: held, not sprayed.
    fx.set_state(B1, STATE_SUSPECT, true);
    assert_eq!(fx.run_bytes(&input).verdict, XDP_DROP);
    // Both down: dropped as having no backend.
    fx.set_state(B1, STATE_DOWN, true);
    let before = fx.count(stats::DROP_NO_BACKEND);
    assert_eq!(fx.run_bytes(&input).verdict, XDP_DROP);
    assert_eq!(fx.count(stats::DROP_NO_BACKEND) - before, 1);
    fx.set_state(B0, STATE_UP, true);
    fx.set_state(B1, STATE_UP, true);
    fx.set_clone("lnA", B0, Some(B1), false);
    let o = fx.run_bytes(&input);
    assert_eq!(sent_to(&fx, &input, &o.out), B0, "back to its owner");
}

#[test]
fn a_dialog_pinned_by_call_id_follows_its_containers_state() {
    let mut fx = Fixture::new(CONFIG);
    let call_id = "pinned-1@h";
    let input = sip_packet(5061, &invite(call_id)).build();
    let o = fx.run_bytes(&input);
    let owner = sent_to(&fx, &input, &o.out);
    let replica = fx.cfg.backends[owner].replica.unwrap();
    fx.set_state(owner, STATE_SUSPECT, true);
    assert_eq!(fx.run_bytes(&input).verdict, XDP_DROP, "held while suspect");
    fx.set_state(owner, STATE_DOWN, true);
    let o = fx.run_bytes(&input);
    assert_eq!(sent_to(&fx, &input, &o.out), replica, "its replica holds the dialog");
    assert_eq!(fx.sip_pin(SIP, call_id).unwrap().backend as usize, replica, "re-pinned");
}

#[test]
fn an_unknown_logical_name_goes_where_its_dialog_began_or_nowhere() {
    let mut fx = Fixture::new(CONFIG);
    let bye =
        |call_id: &str| format!("BYE sip:x@h SIP/2.0\r\nTo: <sip:a@b>;tag=nobody.1_2_2\r\nCall-ID: {call_id}\r\n\r\n");
    let before = (count(&fx, stats::VIP_SIP_UNKNOWN_LN), fx.count(stats::DROP_SIP_UNKNOWN_LN));
    assert_eq!(fx.run(&sip_packet(5061, &bye("never-seen"))).verdict, XDP_DROP);
    assert_eq!(count(&fx, stats::VIP_SIP_UNKNOWN_LN) - before.0, 1);
    assert_eq!(fx.count(stats::DROP_SIP_UNKNOWN_LN) - before.1, 1);
    assert_eq!(fx.sip_pin(SIP, "never-seen"), None, "nothing pinned for an unknown name");

    let input = sip_packet(5061, &invite("began-here")).build();
    let o = fx.run_bytes(&input);
    let first = sent_to(&fx, &input, &o.out);
    let input = sip_packet(5062, &bye("began-here")).build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(sent_to(&fx, &input, &o.out), first, "the container that created the session");
}

/// Issue 30 part 3: a name nobody owns, in a dialog pinned here, is reported to the agent
/// (once a second per name) with the container the dialog began on; a learned name never
/// takes a dialog pinned here away from its container; every forwarded message counts
/// once by how its container was chosen.
#[test]
fn a_dialogs_unknown_name_is_reported_for_learning_and_a_learned_name_yields_to_its_pin() {
    let mut fx = Fixture::new(CONFIG);
    let bye = |call_id: &str, ln: &str| {
        format!("BYE sip:x@h SIP/2.0\r\nRoute: <sip:{VIP};ibmsid={ln}.1138119214953.4_2_2;lr>\r\nCall-ID: {call_id}\r\n\r\n")
    };
    let input = sip_packet(5061, &invite("learn-1")).build();
    let o = fx.run_bytes(&input);
    let first = sent_to(&fx, &input, &o.out);
    assert_eq!(
        (count(&fx, stats::VIP_SIP_BY_RING), count(&fx, stats::VIP_SIP_BY_PIN)),
        (1, 0),
        "a new dialog: the ring"
    );
    assert!(fx.sip_learn_reports().is_empty(), "an initial request names nothing");

    let input = sip_packet(5061, &bye("learn-1", "lnZ")).build();
    let o = fx.run_bytes(&input);
    assert_eq!(o.verdict, XDP_TX);
    assert_eq!(sent_to(&fx, &input, &o.out), first, "by the dialog's pin");
    assert_eq!(count(&fx, stats::VIP_SIP_BY_PIN), 1);
    let reports = fx.sip_learn_reports();
    assert_eq!(reports.len(), 1, "reported once");
    let r = &reports[0];
    let word = |at: usize| u32::from_ne_bytes(r[at..at + 4].try_into().unwrap());
    let dword = |at: usize| u64::from_ne_bytes(r[at..at + 8].try_into().unwrap());
    assert_eq!((word(0) as usize, word(4) as usize), (SIP, first), "the VIP and the dialog's container");
    assert_eq!((dword(8), dword(16)), (cookie_hash(b"lnZ"), cookie_hash(b"learn-1")));
    let msg = bye("learn-1", "lnZ");
    assert_eq!((word(24) as usize, word(28) as u8), (msg.len(), SRC_ROUTE));
    assert_eq!(&r[32..32 + msg.len()], msg.as_bytes(), "the message as it came");
    assert_eq!(fx.count(stats::SIP_LEARN_REPORTED), 1);
    // The same name again within the second: forwarded, not reported again.
    let o = fx.run(&sip_packet(5061, &bye("learn-1", "lnZ")));
    assert_eq!(o.verdict, XDP_TX);
    assert!(fx.sip_learn_reports().is_empty(), "once a second per name");
    // A dialog pinned to a container that is not up (suspect: held) teaches nothing.
    fx.set_state(first, STATE_SUSPECT, false);
    assert_eq!(fx.run(&sip_packet(5061, &bye("learn-1", "lnW"))).verdict, XDP_DROP);
    assert!(fx.sip_learn_reports().is_empty());
    fx.set_state(first, STATE_UP, false);

    // A learned name owned by another container than the one this dialog is pinned to:
    // the dialog goes where it began (counted); a configured name goes to its owner.
    let other = (0..4).find(|&b| b != first && b != (first ^ 1)).unwrap();
    fx.set_clone_flags("lnL", other, Some(other ^ 1), CLONE_F_LEARNED);
    let input = sip_packet(5061, &bye("learn-1", "lnL")).build();
    let o = fx.run_bytes(&input);
    assert_eq!(sent_to(&fx, &input, &o.out), first, "a learned name yields to the pin");
    assert_eq!(fx.count(stats::SIP_PIN_OVER_LEARNED), 1);
    fx.set_clone_flags("lnC", other, Some(other ^ 1), 0);
    let input = sip_packet(5061, &bye("learn-1", "lnC")).build();
    let o = fx.run_bytes(&input);
    assert_eq!(sent_to(&fx, &input, &o.out), other, "a configured name is the owner's");
    // No pin (another dialog): the learned name decides.
    let input = sip_packet(5061, &bye("elsewhere", "lnL")).build();
    let o = fx.run_bytes(&input);
    assert_eq!(sent_to(&fx, &input, &o.out), other);
    assert_eq!(count(&fx, stats::VIP_SIP_BY_LN), 2);
    // Every forwarded message counted once by how it was placed.
    let forwarded = count(&fx, stats::VIP_PACKETS) + count(&fx, stats::VIP_FLOW_HITS);
    let by = count(&fx, stats::VIP_SIP_BY_LN) + count(&fx, stats::VIP_SIP_BY_PIN) + count(&fx, stats::VIP_SIP_BY_RING);
    assert_eq!(by, forwarded);
}

/// Issue 30 part 4: an ACK forwarded to a container counts as evidence that it answers
/// (the SIP health check reads it); other messages do not.
#[test]
fn acks_forwarded_to_a_container_are_counted_as_its_answers_evidence() {
    let mut fx = Fixture::new(CONFIG);
    let input = sip_packet(5061, &invite("ack-1")).build();
    let o = fx.run_bytes(&input);
    let first = sent_to(&fx, &input, &o.out);
    assert_eq!(fx.backend_count(first, stats::BACKEND_SIP_ACKS), 0, "an INVITE is no evidence");
    let ack = invite("ack-1").replacen("INVITE sip", "ACK sip", 1).replacen("1 INVITE", "1 ACK", 1);
    assert_eq!(fx.run(&sip_packet(5061, &ack)).verdict, XDP_TX);
    assert_eq!(fx.backend_count(first, stats::BACKEND_SIP_ACKS), 1);
    // A response whose reason phrase begins "ACK " is not an ACK.
    let response = "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.0.0.2\r\nCall-ID: ack-1\r\nCSeq: 1 ACK\r\n\r\n";
    assert_eq!(fx.run(&sip_packet(5061, response)).verdict, XDP_TX);
    let other = invite("ack-1").replacen("INVITE sip", "ACKX sip", 1);
    assert_eq!(fx.run(&sip_packet(5061, &other)).verdict, XDP_TX);
    assert_eq!(fx.backend_count(first, stats::BACKEND_SIP_ACKS), 1);
}

#[test]
fn malformed_sip_gets_a_defined_counted_verdict() {
    let mut fx = Fixture::new(CONFIG);
    let mut long = String::from("OPTIONS sip:x@h SIP/2.0\r\nX-Pad: ");
    long.push_str(&"a".repeat(SIP_SCAN_MAX));
    long.push_str("\r\nCall-ID: long\r\n\r\n");
    let cases: Vec<(&str, Vec<u8>, u32)> = vec![
        ("HTTP, not SIP", b"GET / HTTP/1.1\r\nHost: h\r\nCall-ID: x\r\n\r\n".to_vec(), stats::DROP_SIP_INVALID),
        ("no end of the header section", b"BYE sip:x SIP/2.0\r\nCall-ID: c\r\n".to_vec(), stats::DROP_SIP_INVALID),
        ("no CRLF at all", b"BYE sip:x SIP/2.0 Call-ID: c".to_vec(), stats::DROP_SIP_INVALID),
        ("no Call-ID", b"BYE sip:x SIP/2.0\r\nCSeq: 1 BYE\r\n\r\n".to_vec(), stats::DROP_SIP_INVALID),
        ("binary", (0..=255u8).cycle().take(600).collect(), stats::DROP_SIP_INVALID),
        ("empty payload", Vec::new(), stats::DROP_SIP_INVALID),
        ("header section past the scan limit", long.into_bytes(), stats::DROP_SIP_TOO_LONG),
    ];
    for (what, payload, slot) in cases {
        let before = (fx.count(slot), count(&fx, stats::VIP_SIP_INVALID), count(&fx, stats::VIP_DROPS));
        let p = Packet::udp("10.0.0.2", 5061, VIP, 5060).with(|p| p.payload = payload);
        assert_eq!(fx.run(&p).verdict, XDP_DROP, "{what}");
        assert_eq!(fx.count(slot) - before.0, 1, "{what}: counted by reason");
        assert_eq!(count(&fx, stats::VIP_SIP_INVALID) - before.1, 1, "{what}: counted on the VIP");
        assert_eq!(count(&fx, stats::VIP_DROPS) - before.2, 1, "{what}");
    }
    // The UDP length must cover its header and fit in the IP payload; bytes past a shorter
    // one are not the message (the receiving kernel ignores them too).
    let msg = invite("udp-len");
    for (what, udp_len) in [("UDP length past the IP payload", msg.len() + 9), ("UDP length under its header", 7)] {
        let before = (fx.count(stats::DROP_BAD_LENGTH), count(&fx, stats::VIP_DROPS));
        let p = sip_packet(5061, &msg).with(|p| p.udp_len = Some(udp_len as u16));
        assert_eq!(fx.run(&p).verdict, XDP_DROP, "{what}");
        assert_eq!(
            (fx.count(stats::DROP_BAD_LENGTH) - before.0, count(&fx, stats::VIP_DROPS) - before.1),
            (1, 1),
            "{what}"
        );
    }
    let cut_before_the_end = sip_packet(5061, &msg).with(|p| p.udp_len = Some((8 + msg.len() - 2) as u16));
    assert_eq!(fx.run(&cut_before_the_end).verdict, XDP_DROP, "the message ends where the UDP length says");
    let padded =
        sip_packet(5061, &format!("{msg}Call-ID: not-this-one\r\n")).with(|p| p.udp_len = Some((8 + msg.len()) as u16));
    assert_eq!(fx.run(&padded).verdict, XDP_TX, "bytes past the UDP length are ignored");
    assert!(
        fx.sip_pin(SIP, "udp-len").is_some() && fx.sip_pin(SIP, "not-this-one").is_none(),
        "pinned by the message's own Call-ID"
    );
    // RFC 3261 8.1.1: no Call-ID, no SIP message, even with a logical name that has an owner.
    fx.set_clone("lnA", B0, Some(B1), false);
    let before = fx.count(stats::DROP_SIP_INVALID);
    let p = sip_packet(5061, "BYE sip:x@h SIP/2.0\r\nRoute: <sip:p;lr;ibmsid=lnA.1_2_3>\r\nCSeq: 1 BYE\r\n\r\n");
    assert_eq!(fx.run(&p).verdict, XDP_DROP, "a known ibmsid without a Call-ID");
    assert_eq!(fx.count(stats::DROP_SIP_INVALID) - before, 1);
    // A UDP header cut short: the generic truncation rule.
    let p = sip_packet(5061, &invite("t")).with(|p| p.truncate = Some(14 + 20 + 4));
    assert_eq!(fx.run(&p).verdict, XDP_DROP);
    // A message cut inside (the IP length says more than the frame holds).
    let p = sip_packet(5061, &invite("cut")).with(|p| p.truncate = Some(14 + 20 + 8 + 40));
    assert_eq!(fx.run(&p).verdict, XDP_DROP, "cut in the middle");
    // TCP to the SIP port: not this VIP (SIP VIPs are UDP), passed to the host.
    let before = fx.count(stats::PASS_NON_VIP);
    let p = Packet::tcp("10.0.0.2", 5061, VIP, 5060).with(|p| p.payload = invite("tcp").into_bytes());
    assert_eq!(fx.run(&p).verdict, XDP_PASS);
    assert_eq!(fx.count(stats::PASS_NON_VIP) - before, 1);
}

// ---- UDP datagrams in IP fragments (issue 30) ----

/// The fixtures' VIPs and, after them, an IPv6 SIP VIP and two IPv4 L4 UDP VIPs (MAC and
/// IPIP forwarding).
fn frag_fixture() -> Fixture {
    let extra = r#"
[[vip]]
name = "sip6"
address = "fd00::500"
port = 5060
mode = "sip"
ring_size = 1009

[[vip]]
name = "udp4"
address = "10.0.100.6"
port = 53
protocol = "udp"
ring_size = 1009

[[vip]]
name = "udp4-ipip"
address = "10.0.100.7"
port = 53
protocol = "udp"
forwarding = "ipip"
encap_source = "10.0.0.1"
ring_size = 1009
"#;
    Fixture::new(&format!("{CONFIG}{extra}"))
}
const MAC6: usize = 2;
const SIP6: usize = 8;
const UDP4: usize = 9;
const UDP4_IPIP: usize = 10;

/// An INVITE with a 3 KB SDP offer (several codecs, ICE candidates' worth of lines):
/// more than one 1,500-byte MTU holds.
fn large_invite(call_id: &str, vip: &str) -> String {
    let mut sdp = String::from(
        "v=0\r\no=- 1 1 IN IP4 10.0.0.2\r\ns=-\r\nc=IN IP4 10.0.0.2\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0 8 18 101\r\n",
    );
    for i in 0.. {
        if sdp.len() >= 3000 {
            break;
        }
        sdp.push_str(&format!("a=candidate:{i} 1 UDP 2130706431 10.0.0.2 {} typ host generation 0\r\n", 6000 + i));
    }
    format!(
        "INVITE sip:service@{vip}:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2:5061;branch=z9hG4bK-{call_id}\r\nFrom: sipp <sip:sipp@10.0.0.2:5061>;tag=77\r\nTo: sut <sip:service@{vip}:5060>\r\nCall-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: <sip:sipp@10.0.0.2:5061>\r\nMax-Forwards: 70\r\nContent-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
        sdp.len()
    )
}

/// Fragments of at most this many bytes of the datagram: what a 1,500-byte MTU carries
/// (IPv4: 1,480; IPv6 with its Fragment header: 1,448).
fn mtu_chunk(p: &Packet) -> usize {
    if p.src.is_ipv4() {
        1480
    } else {
        1448
    }
}

#[test]
fn every_fragment_of_a_large_sip_message_reaches_the_container_its_first_one_went_to() {
    let mut fx = frag_fixture();
    for (vip, vip_addr, client) in [(SIP, VIP, "10.0.0.2"), (SIP6, "fd00::500", "fd00::2")] {
        let before = (fx.count(stats::FRAG_FIRST), fx.count(stats::FRAG_FOLLOWED));
        let vip_before = (
            fx.count(vip_slot(vip as u32, stats::VIP_FRAG_FIRST)),
            fx.count(vip_slot(vip as u32, stats::VIP_FRAG_FOLLOWED)),
        );
        let mut used = std::collections::HashSet::new();
        let mut later_sent = 0;
        for i in 0..12u32 {
            let call_id = format!("{i}-large@{client}");
            let p = Packet::udp(client, 5061, vip_addr, 5060)
                .with(|p| p.payload = large_invite(&call_id, vip_addr).into_bytes());
            let id = 0x1000 + i;
            let frames = p.fragments(mtu_chunk(&p), id);
            assert!(frames.len() >= 3, "a 3 KB SDP takes three fragments: {}", frames.len());
            let o = fx.run_bytes(&frames[0]);
            assert_eq!(o.verdict, XDP_TX, "{call_id}: the first fragment is dispatched");
            let owner = sent_to(&fx, &frames[0], &o.out);
            used.insert(owner);
            let rec = fx.frag_record(&p, id).expect("the first fragment's choice is recorded");
            assert_eq!((rec.backend as usize, rec.vip as usize), (owner, vip), "{call_id}");
            assert_eq!(
                fx.sip_pin(vip, &call_id).map(|f| f.backend as usize),
                Some(owner),
                "the dialog is pinned by its Call-ID"
            );
            // The later fragments, the last one first: each to the same container, untouched.
            for f in frames[1..].iter().rev() {
                let o = fx.run_bytes(f);
                assert_eq!(o.verdict, XDP_TX, "{call_id}: a later fragment is forwarded");
                assert_eq!(sent_to(&fx, f, &o.out), owner, "{call_id}: where its first fragment went");
                later_sent += 1;
            }
        }
        assert!(used.len() >= 2, "the calls spread over the containers: {used:?}");
        assert_eq!(fx.count(stats::FRAG_FIRST) - before.0, 12);
        assert_eq!(fx.count(stats::FRAG_FOLLOWED) - before.1, later_sent);
        assert_eq!(fx.count(vip_slot(vip as u32, stats::VIP_FRAG_FIRST)) - vip_before.0, 12);
        assert_eq!(fx.count(vip_slot(vip as u32, stats::VIP_FRAG_FOLLOWED)) - vip_before.1, later_sent);
    }
}

#[test]
fn a_header_section_that_goes_on_past_the_first_fragment_is_read_as_far_as_it_holds() {
    let mut fx = frag_fixture();
    fx.set_clone("lnA", B1, Some(B0), false);
    // 50 long Route entries after the one that names the LN: the header section ends in
    // the second fragment.
    let mut msg = format!("BYE sip:service@{VIP}:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2:5061;branch=z9hG4bK-r\r\nCall-ID: routes-1\r\nRoute: <sip:{VIP}:5060;transport=udp;ibmsid=lnA.1138119214953.4_2_2;lr>\r\n");
    for i in 0..50 {
        msg.push_str(&format!(
            "Route: <sip:proxy-{i}.carrier.example.net:5060;transport=udp;lr;x-long-parameter=abcdefghij>\r\n"
        ));
    }
    msg.push_str("CSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n");
    let p = sip_packet(5061, &msg);
    let frames = p.fragments(1480, 77);
    assert!(frames.len() >= 3);
    let o = fx.run_bytes(&frames[0]);
    assert_eq!(o.verdict, XDP_TX, "the first fragment holds the LN and the Call-ID");
    assert_eq!(sent_to(&fx, &frames[0], &o.out), B1, "to the LN's owner");
    for f in &frames[1..] {
        let o = fx.run_bytes(f);
        assert_eq!(sent_to(&fx, f, &o.out), B1);
    }
    assert_eq!(count(&fx, vip_sip_source(SRC_ROUTE)), 1);
    // Without a Call-ID in the first fragment it is no SIP message it can route.
    let no_call_id = msg.replace("Call-ID: routes-1\r\n", "").replace("CSeq: 2 BYE", "Call-ID: late\r\nCSeq: 2 BYE");
    let frames = sip_packet(5061, &no_call_id).fragments(1480, 78);
    let before = fx.count(stats::DROP_SIP_INVALID);
    assert_eq!(fx.run_bytes(&frames[0]).verdict, XDP_DROP);
    assert_eq!(fx.count(stats::DROP_SIP_INVALID) - before, 1);
    assert_eq!(fx.run_bytes(&frames[1]).verdict, XDP_DROP, "its later fragments have no first to follow");
}

#[test]
fn a_fragment_with_no_first_before_it_is_dropped_and_counted_never_passed() {
    let mut fx = frag_fixture();
    let p = sip_packet(5061, &large_invite("orphan-1", VIP));
    let frames = p.fragments(1480, 4242);
    let snap = |fx: &Fixture| {
        (fx.count(stats::DROP_FRAG_NO_FIRST), count(fx, stats::VIP_FRAG_NO_FIRST), count(fx, stats::VIP_DROPS))
    };
    let before = snap(&fx);
    assert_eq!(fx.run_bytes(&frames[2]).verdict, XDP_DROP, "the last fragment before the first: dropped");
    assert_eq!(fx.run_bytes(&frames[1]).verdict, XDP_DROP);
    let after = snap(&fx);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (2, 2, 2),
        "counted by reason and on the VIP"
    );
    assert_eq!(fx.frag_record(&p, 4242), None, "an orphan records nothing");
    // The retransmission (SIP over UDP resends the whole message) goes through.
    let o = fx.run_bytes(&frames[0]);
    assert_eq!(o.verdict, XDP_TX);
    let owner = sent_to(&fx, &frames[0], &o.out);
    for f in &frames[1..] {
        let o = fx.run_bytes(f);
        assert_eq!(sent_to(&fx, f, &o.out), owner);
    }
    // Another source with the same IP ID is another datagram.
    let other = Packet::udp("10.0.0.3", 5061, VIP, 5060).with(|q| q.payload = p.payload.clone()).fragments(1480, 4242);
    assert_eq!(fx.run_bytes(&other[1]).verdict, XDP_DROP, "the key holds the source");

    // A later fragment to an address with no VIP is not ours: passed as before.
    let elsewhere =
        Packet::udp("10.0.0.2", 5061, "10.0.0.99", 5060).with(|q| q.payload = p.payload.clone()).fragments(1480, 1);
    let before = fx.count(stats::PASS_NON_VIP);
    assert_eq!(fx.run_bytes(&elsewhere[1]).verdict, XDP_PASS);
    assert_eq!(fx.count(stats::PASS_NON_VIP) - before, 1);
    // A port of the VIP address that is no VIP: the host's, with all its fragments.
    let host = Packet::udp("10.0.0.2", 5061, VIP, 5070).with(|q| q.payload = p.payload.clone());
    let frames_host = host.fragments(1480, 9);
    let before = fx.count(stats::PASS_FRAGMENT);
    assert_eq!(fx.run_bytes(&frames_host[0]).verdict, XDP_PASS);
    assert_eq!(fx.frag_record(&host, 9).map(|r| r.backend), Some(NO_BACKEND), "recorded as the host's");
    assert_eq!(fx.run_bytes(&frames_host[1]).verdict, XDP_PASS, "follows its first fragment to the host");
    assert_eq!(fx.count(stats::PASS_FRAGMENT) - before, 2);

    // A first fragment whose UDP length fits in it is no first fragment: impossible.
    let fits = sip_packet(5061, &invite("fits")).with(|q| q.frag_off = 0x2000).build();
    let before = fx.count(stats::DROP_BAD_LENGTH);
    assert_eq!(fx.run_bytes(&fits).verdict, XDP_DROP);
    assert_eq!(fx.count(stats::DROP_BAD_LENGTH) - before, 1);

    // A record lives FRAG_LIFETIME_NS (2 s): a later fragment after that has no first.
    let late = sip_packet(5061, &large_invite("late-1", VIP)).fragments(1480, 5151);
    assert_eq!(fx.run_bytes(&late[0]).verdict, XDP_TX);
    std::thread::sleep(std::time::Duration::from_millis(2300));
    let before = fx.count(stats::DROP_FRAG_NO_FIRST);
    assert_eq!(fx.run_bytes(&late[1]).verdict, XDP_DROP, "too late to follow");
    assert_eq!(fx.count(stats::DROP_FRAG_NO_FIRST) - before, 1);
}

/// Runs on CPU 0 only: `FRAG_BUDGET` is per CPU.
fn pin_to_one_cpu() {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("sched_setaffinity");
}

#[test]
fn a_flood_of_first_fragments_is_rationed_and_cannot_evict_a_live_datagram() {
    pin_to_one_cpu();
    let small =
        |src: &str, sport: u16| Packet::udp(src, sport, "10.0.100.6", 53).with(|p| p.payload = (0..24u8).collect());
    // The budget is per second: a run that takes longer than that (a loaded machine) is
    // made again, at most three times.
    for attempt in 0.. {
        let mut fx = frag_fixture();
        let started = std::time::Instant::now();
        let live = small("10.0.0.2", 7000);
        let live_frames = live.fragments(16, 1);
        let o = fx.run_bytes(&live_frames[0]);
        assert_eq!(o.verdict, XDP_TX);
        let owner = sent_to(&fx, &live_frames[0], &o.out);
        // A flood of first fragments never completed, each of another datagram.
        let mut accepted = 1u64;
        let mut dropped = 0u64;
        for i in 0..(FRAG_BUDGET_PER_SEC + 500) {
            let src = format!("10.1.{}.{}", (i >> 8) & 0xff, i & 0xff);
            let f = &small(&src, 7001).fragments(16, i as u32)[0];
            match fx.run_bytes(f).verdict {
                XDP_TX => accepted += 1,
                XDP_DROP => dropped += 1,
                v => panic!("verdict {v}"),
            }
        }
        if started.elapsed() >= std::time::Duration::from_millis(900) && attempt < 2 {
            continue;
        }
        assert_eq!(accepted, FRAG_BUDGET_PER_SEC, "one CPU makes at most its budget of new entries a second");
        assert_eq!(dropped, 501);
        assert_eq!(fx.count(stats::DROP_FRAG_BUDGET), 501, "counted by reason");
        assert_eq!(fx.count(vip_slot(UDP4 as u32, stats::VIP_FRAG_BUDGET)), 501, "and on the VIP");
        // The live datagram's entry is still there: its last fragment follows.
        let o = fx.run_bytes(&live_frames[1]);
        assert_eq!(o.verdict, XDP_TX, "a live entry survives the flood");
        assert_eq!(sent_to(&fx, &live_frames[1], &o.out), owner);
        // The next second brings a new budget.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let f = &small("10.2.0.1", 7002).fragments(16, 9)[0];
        assert_eq!(fx.run_bytes(f).verdict, XDP_TX, "a new second, a new budget");
        return;
    }
}

#[test]
fn an_l4_udp_vips_fragments_follow_the_first_ones_choice() {
    let mut fx = frag_fixture();
    for (vip, client, addr) in [(UDP4, "10.0.0.2", "10.0.100.6"), (MAC6, "fd00::2", "fd00::100")] {
        let mut used = std::collections::HashSet::new();
        for i in 0..16u16 {
            let p = Packet::udp(client, 20000 + i, addr, 53).with(|p| p.payload = vec![0x5a; 4000]);
            let frames = p.fragments(mtu_chunk(&p), 300 + i as u32);
            let o = fx.run_bytes(&frames[0]);
            assert_eq!(o.verdict, XDP_TX);
            let b = sent_to(&fx, &frames[0], &o.out);
            assert_eq!(b, fx.ring_choice(vip, &p), "the first fragment goes by its ports, as a whole datagram would");
            used.insert(b);
            for f in &frames[1..] {
                let o = fx.run_bytes(f);
                assert_eq!(o.verdict, XDP_TX);
                assert_eq!(sent_to(&fx, f, &o.out), b, "a later fragment follows its first");
            }
        }
        assert!(used.len() >= 2, "{used:?}");
        assert_eq!(fx.count(vip_slot(vip as u32, stats::VIP_FRAG_FIRST)), 16);
    }
    // IPv6: a Fragment header behind another extension header (here hop-by-hop) is not
    // walked to: such a packet keeps its verdict, to the host stack (documented limit).
    let p = Packet::udp("fd00::7", 20500, "fd00::100", 53).with(|p| p.payload = vec![0x5a; 3000]);
    let mut g = p.fragments(1440, 4711)[0].clone();
    g[14 + 6] = 0; // next header: hop-by-hop
    let plen = u16::from_be_bytes([g[14 + 4], g[14 + 5]]) + 8;
    g[14 + 4..14 + 6].copy_from_slice(&plen.to_be_bytes());
    g.splice(14 + 40..14 + 40, [44, 0, 1, 4, 0, 0, 0, 0]); // next: Fragment; PadN
    let before = fx.count(stats::PASS_IPV6_EXT);
    assert_eq!(fx.run_bytes(&g).verdict, XDP_PASS);
    assert_eq!(fx.count(stats::PASS_IPV6_EXT) - before, 1);

    // IPIP: a later fragment is encapsulated to the same backend as its first.
    let p = Packet::udp("10.0.0.2", 20001, "10.0.100.7", 53).with(|p| p.payload = vec![0x5a; 3000]);
    let frames = p.fragments(1480, 99);
    let b = fx.ring_choice(UDP4_IPIP, &p);
    for f in &frames {
        let o = fx.run_bytes(f);
        assert_eq!(o.verdict, XDP_TX);
        assert_eq!(o.out.len(), f.len() + 20, "one outer IPv4 header: 20 bytes more than the fragment");
        assert_eq!(&o.out[14 + 20..], &f[14..], "the fragment inside, unchanged");
        assert_eq!(&o.out[14 + 16..14 + 20], &fx.cfg.backends[b].address.octets(), "outer destination: the backend");
        assert_eq!(&o.out[0..6], &fx.mac(b));
    }
    // TCP fragments keep their verdict: to the host stack, counted.
    let before = fx.count(stats::PASS_FRAGMENT);
    let tcp = Packet::tcp("10.0.0.2", 40000, "10.0.100.1", 80).with(|p| p.frag_off = 0x2000);
    assert_eq!(fx.run(&tcp).verdict, XDP_PASS);
    assert_eq!(fx.count(stats::PASS_FRAGMENT) - before, 1);
}
