//! SIP VIP fixtures for the XDP program (BPF_PROG_TEST_RUN, needs root): every affinity
//! form, the owner's states, unknown names, and malformed input, each with its verdict,
//! output bytes and counters.

use dispatcher_common::{
    hash::cookie_hash,
    sip::{SIP_SCAN_MAX, SRC_CALL_ID, SRC_FROM_TAG, SRC_ROUTE, SRC_TO_TAG, SRC_VIA},
    stats::{self, vip_sip_source, vip_slot},
    CLONE_F_LEARNED, STATE_DOWN, STATE_SUSPECT, STATE_UP,
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
