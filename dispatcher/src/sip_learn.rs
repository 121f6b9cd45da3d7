//! Learning SIP logical names from the dialogs themselves, for containers that do not name
//! theirs in their answers to the health check.
//!
//! With direct server return the dispatcher never sees a container's answers, but it sees
//! the first in-dialog request of each call: its Route `ibmsid` (or To tag) carries the
//! logical name the container put in its answer, and its Call-ID is pinned (`FLOWS`) to
//! the container that took the dialog's first request. When such a name is owned by
//! nobody yet, the XDP program forwards the message by the pin and reports it on the
//! `SIP_LEARN` ring buffer (`dispatcher-ebpf/src/sip.rs`: once a second per name, a budget
//! per CPU). Here each report is taken as untrusted input — the ids must be a SIP VIP and
//! one of its backends, the message must scan to the reported name and Call-ID, and the
//! name must be found in it by its hash — and the name is learned for that container
//! through the clone table (shared through etcd like every learned name, never over a
//! configured or earlier one).
//!
//! A name learned so may come from a message anyone could send: the XDP program lets a
//! dialog pinned here to another live container go where it began
//! (`CLONE_F_LEARNED`), so a forged name can never take a dialog this dispatcher placed
//! away from its container.

use std::{mem::size_of, sync::atomic::Ordering};

use aya::maps::{MapData, RingBuf};
use dispatcher_common::{
    sip::{logical_name_with_hash, scan, SIP_SCAN_MAX, SRC_CALL_ID},
    SipLearnEvent,
};
use tokio::io::unix::AsyncFd;

use crate::{
    config::{Config, VipKind},
    state::{Learned, Servers, MAX_DIALOG_LEARNED},
};

/// The report's fixed part, before the message bytes.
const HEADER: usize = size_of::<SipLearnEvent>() - SIP_SCAN_MAX;

/// What a report says, once checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    pub vip: usize,
    pub backend: usize,
    pub logical_name: String,
}

/// Why a report was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Short,
    UnknownIds,
    /// The message does not scan to the name and Call-ID reported.
    Mismatch,
}

/// Checks one report against the configuration.
pub fn check(bytes: &[u8], cfg: &Config) -> Result<Report, Refused> {
    if bytes.len() < HEADER {
        return Err(Refused::Short);
    }
    let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
    let dword = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap());
    let (vip, backend, ln, call_id, len, src) =
        (word(0) as usize, word(4) as usize, dword(8), dword(16), word(24) as usize, word(28));
    if len == 0 || len > SIP_SCAN_MAX || bytes.len() < HEADER + len {
        return Err(Refused::Short);
    }
    let serves = cfg
        .vips
        .get(vip)
        .is_some_and(|v| matches!(v.kind, VipKind::Sip(_)) && !v.retired && v.backends.contains(&backend));
    if !serves || backend >= cfg.backends.len() {
        return Err(Refused::UnknownIds);
    }
    let msg = &bytes[HEADER..HEADER + len];
    let s = scan(msg);
    let agrees = src != SRC_CALL_ID as u32 && s.affinity() == Some((src as u8, ln)) && s.call_id == call_id;
    let name = logical_name_with_hash(msg, ln).filter(|_| agrees).ok_or(Refused::Mismatch)?;
    Ok(Report { vip, backend, logical_name: String::from_utf8_lossy(name).into_owned() })
}

/// Reads the reports for as long as the agent runs, each learned into the current
/// configuration's clone table.
pub async fn run(ring: RingBuf<MapData>, current: crate::shared::Current) {
    // SAFETY: the ring buffer owns its descriptor, which stays open while the AsyncFd
    // holds it (the AsyncFd deregisters it before dropping the ring).
    let mut ring = match unsafe { AsyncFd::register(ring) } {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "SIP_LEARN: not learning logical names from dialogs");
            return;
        }
    };
    loop {
        let mut guard = match ring.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "SIP_LEARN: not learning logical names from dialogs");
                return;
            }
        };
        let (cfg, servers) = current.read().unwrap().clone();
        let ring = guard.get_inner_mut();
        // Bounded per wakeup: the ring holds about 120 reports.
        for _ in 0..256 {
            let Some(item) = ring.next() else { break };
            learn(&item, &cfg, &servers);
        }
        guard.clear_ready();
    }
}

fn learn(bytes: &[u8], cfg: &Config, servers: &Servers) {
    match check(bytes, cfg) {
        Ok(r) => {
            if servers.learn_logical_name_from_dialog(r.logical_name.as_bytes(), r.backend) == Learned::Refused {
                servers.counters.sip_learn_refused.fetch_add(1, Ordering::Relaxed);
                crate::ratelimit::warn_that(
                    "SIP_LEARN name refused",
                    &format_args!(
                        "SIP_LEARN: `{}` not learned (malformed, or {MAX_DIALOG_LEARNED} names learned from dialogs already)",
                        r.logical_name.escape_debug()
                    ),
                );
            }
        }
        Err(why) => {
            servers.counters.sip_learn_refused.fetch_add(1, Ordering::Relaxed);
            crate::ratelimit::warn_that(
                "SIP_LEARN report refused",
                &format_args!("SIP_LEARN: a report refused ({why:?})"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dispatcher_common::{hash::cookie_hash, sip::SRC_ROUTE};

    const CFG: &str = "[dispatcher]\ninterface = \"lo\"\n\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.1\"\nmac = \"02:00:00:00:00:01\"\nreplica = \"b\"\n\n[[backend]]\nname = \"b\"\naddress = \"10.0.0.2\"\nmac = \"02:00:00:00:00:02\"\nreplica = \"a\"\n\n[[backend]]\nname = \"c\"\naddress = \"10.0.0.3\"\nmac = \"02:00:00:00:00:03\"\n\n[[vip]]\nname = \"sip\"\naddress = \"10.0.100.5\"\nport = 5060\nprotocol = \"udp\"\nmode = \"sip\"\nbackends = [\"a\", \"b\"]\n";

    const BYE: &[u8] = b"BYE sip:x@h SIP/2.0\r\nRoute: <sip:10.0.100.5;ibmsid=lnX.1138119214953.4_2_2;lr>\r\nTo: <sip:a@b>;tag=other.1_2_3\r\nCall-ID: c-1\r\n\r\n";

    fn report(vip: u32, backend: u32, ln: &[u8], call_id: &[u8], src: u8, msg: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(vip.to_ne_bytes());
        v.extend(backend.to_ne_bytes());
        v.extend(cookie_hash(ln).to_ne_bytes());
        v.extend(cookie_hash(call_id).to_ne_bytes());
        v.extend((msg.len() as u32).to_ne_bytes());
        v.extend((src as u32).to_ne_bytes());
        v.extend(msg);
        v.resize(size_of::<SipLearnEvent>(), 0);
        v
    }

    fn cfg() -> Config {
        Config::parse(CFG, "t").unwrap()
    }

    #[test]
    fn a_report_names_the_logical_name_its_hash_stands_for() {
        let r = check(&report(0, 1, b"lnX", b"c-1", SRC_ROUTE, BYE), &cfg()).unwrap();
        assert_eq!(r, Report { vip: 0, backend: 1, logical_name: "lnX".into() });
    }

    #[test]
    fn reports_that_do_not_hold_together_are_refused() {
        let cfg = cfg();
        let cases: [(&str, Vec<u8>, Refused); 7] = [
            ("cut short", report(0, 1, b"lnX", b"c-1", SRC_ROUTE, BYE)[..20].to_vec(), Refused::Short),
            (
                "length past the record",
                {
                    let mut r = report(0, 1, b"lnX", b"c-1", SRC_ROUTE, BYE);
                    r[24..28].copy_from_slice(&(SIP_SCAN_MAX as u32 + 1).to_ne_bytes());
                    r
                },
                Refused::Short,
            ),
            ("no such VIP", report(9, 1, b"lnX", b"c-1", SRC_ROUTE, BYE), Refused::UnknownIds),
            ("a backend not of the VIP", report(0, 2, b"lnX", b"c-1", SRC_ROUTE, BYE), Refused::UnknownIds),
            ("another name's hash", report(0, 1, b"lnY", b"c-1", SRC_ROUTE, BYE), Refused::Mismatch),
            ("another Call-ID", report(0, 1, b"lnX", b"c-2", SRC_ROUTE, BYE), Refused::Mismatch),
            ("a Call-ID is no name", report(0, 1, b"c-1", b"c-1", SRC_CALL_ID, BYE), Refused::Mismatch),
        ];
        for (what, bytes, why) in cases {
            assert_eq!(check(&bytes, &cfg), Err(why), "{what}");
        }
    }

    #[test]
    fn a_checked_report_is_learned_for_the_dialogs_container_and_marked_so() {
        let cfg = cfg();
        let servers = Servers::new(&cfg, &[], &[], None);
        learn(&report(0, 1, b"lnX", b"c-1", SRC_ROUTE, BYE), &cfg, &servers);
        assert_eq!(servers.owner(b"lnX"), Some((1, Some(0))));
        let (_, rows) = servers.clone_rows(true, 0, 100);
        assert_eq!(rows.iter().find(|r| r.id == "lnX").map(|r| r.origin), Some(crate::state::Origin::SipDialog));
        // A forged report is counted, never learned.
        learn(&report(0, 0, b"lnY", b"c-1", SRC_ROUTE, BYE), &cfg, &servers);
        assert_eq!(servers.owner(b"lnY"), None);
        assert_eq!(servers.counters.sip_learn_refused.load(Ordering::Relaxed), 1);
        // A second container claiming the name later does not take it.
        learn(&report(0, 0, b"lnX", b"c-1", SRC_ROUTE, BYE), &cfg, &servers);
        assert_eq!(servers.owner(b"lnX"), Some((1, Some(0))));
    }

    /// Callers write these names: a caller inventing them fills no more than
    /// `MAX_DIALOG_LEARNED` entries; the rest are refused and counted.
    #[test]
    fn names_learned_from_dialogs_are_bounded() {
        let cfg = cfg();
        let servers = Servers::new(&cfg, &[], &[], None);
        for i in 0..MAX_DIALOG_LEARNED + 3 {
            let ln = format!("f{i}");
            let bye = String::from_utf8_lossy(BYE).replace("lnX", &ln);
            learn(&report(0, 1, ln.as_bytes(), b"c-1", SRC_ROUTE, bye.as_bytes()), &cfg, &servers);
        }
        assert_eq!(servers.clone_count(), MAX_DIALOG_LEARNED);
        assert_eq!(servers.counters.sip_learn_refused.load(Ordering::Relaxed), 3);
        // A name learned otherwise (a check's answer) is not held back by it.
        assert_eq!(servers.learn_logical_name(b"lnCheck", 0), Learned::New);
    }
}
