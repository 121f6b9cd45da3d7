//! What the store holds, as every dispatcher reads it, and the one rule they all evaluate
//! on it. Pure: no I/O, so that the rule is tested here and is the same everywhere.
//!
//! Keys, under `[cluster] key_prefix`:
//!
//! | key | value | written by | lifetime |
//! |---|---|---|---|
//! | `members/<dispatcher>` | JSON `Member`: who, and the backends its own checks see down | that dispatcher, at start and on a change of its verdicts | its lease |
//! | `operator/<backend>` | `drain` or `disabled` (absent: none) | any dispatcher, on an operator's command | until the next command |
//! | `clones/<clone or partition ID>` | backend name | the first dispatcher that learned it (create-if-absent) | kept |

use std::collections::BTreeMap;

use dispatcher_common::Operator;
use serde::{Deserialize, Serialize};

/// A live dispatcher, as it registered itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    /// Seconds since the epoch when its agent started.
    pub started: u64,
    pub pid: u32,
    pub version: String,
    /// The backends this dispatcher's own checks see down (its published verdicts).
    #[serde(default)]
    pub down: Vec<String>,
    /// Its MAC on the segment it shares with the others, when it steers HTTP connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// It takes connections: in every dispatcher's ownership table (false after
    /// `dispatcher leave`, while its own connections finish).
    #[serde(default)]
    pub joined: bool,
}

/// A change the agent acts on, from one key written or deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Membership or a verdict: the health rule may decide differently now.
    Verdicts,
    Operator {
        backend: String,
        op: Operator,
    },
    Clone {
        id: String,
        backend: String,
    },
    /// A key this version does not know (written by a newer one) or a malformed value.
    Ignored,
}

/// The store's contents under the prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub members: BTreeMap<String, Member>,
    pub operators: BTreeMap<String, Operator>,
    pub clones: BTreeMap<String, String>,
}

pub fn member_key(prefix: &str, me: &str) -> String {
    format!("{prefix}/members/{me}")
}

pub fn operator_key(prefix: &str, backend: &str) -> String {
    format!("{prefix}/operator/{backend}")
}

pub fn clone_key(prefix: &str, id: &str) -> String {
    format!("{prefix}/clones/{id}")
}

pub fn operator_value(op: Operator) -> Option<&'static str> {
    match op {
        Operator::None => None,
        Operator::Drain => Some("drain"),
        Operator::Disabled => Some("disabled"),
    }
}

impl View {
    /// The dispatchers that take HTTP connections: joined, with a MAC.
    pub fn steering_peers(&self) -> Vec<crate::steering::Peer> {
        self.members
            .values()
            .filter(|m| m.joined)
            .filter_map(|m| {
                let mac = crate::steering::table::parse_mac(m.mac.as_deref()?)?;
                Some(crate::steering::Peer { name: m.name.clone(), mac })
            })
            .collect()
    }

    /// A key under `prefix` was written (`Some(value)`) or deleted (`None`).
    pub fn apply(&mut self, prefix: &str, key: &[u8], value: Option<&[u8]>) -> Change {
        let Some(rest) =
            std::str::from_utf8(key).ok().and_then(|k| k.strip_prefix(prefix)).and_then(|k| k.strip_prefix('/'))
        else {
            return Change::Ignored;
        };
        let text = value.map(|v| std::str::from_utf8(v).map(str::trim));
        let parts: Vec<&str> = rest.split('/').collect();
        match (parts.as_slice(), text) {
            (["members", name], None) => {
                self.members.remove(*name);
                Change::Verdicts
            }
            (["members", name], Some(Ok(v))) => match serde_json::from_str::<Member>(v) {
                Ok(m) if m.name == *name => {
                    self.members.insert(name.to_string(), m);
                    Change::Verdicts
                }
                _ => Change::Ignored,
            },
            (["operator", backend], v) => {
                let op = match v {
                    None => Operator::None,
                    Some(Ok("drain")) => Operator::Drain,
                    Some(Ok("disabled")) => Operator::Disabled,
                    _ => return Change::Ignored,
                };
                if op == Operator::None {
                    self.operators.remove(*backend);
                } else {
                    self.operators.insert(backend.to_string(), op);
                }
                Change::Operator { backend: backend.to_string(), op }
            }
            (["clones", id], Some(Ok(backend))) if !backend.is_empty() => {
                self.clones.insert(id.to_string(), backend.to_string());
                Change::Clone { id: id.to_string(), backend: backend.to_string() }
            }
            (["clones", id], None) => {
                self.clones.remove(*id);
                Change::Ignored
            }
            _ => Change::Ignored,
        }
    }

    /// The cluster-wide health rule: a backend is out when more than half of the live
    /// dispatchers (those holding a lease) publish it down. A dispatcher whose lease
    /// expired counts neither way; the operator's word is applied on its own
    /// (`operators`). Every dispatcher evaluates this on the same keys and so decides the
    /// same.
    pub fn out_by_majority(&self, backend: &str) -> bool {
        let live = self.members.len();
        let down = self.members.values().filter(|m| m.down.iter().any(|d| d == backend)).count();
        live > 0 && down * 2 > live
    }

    /// The live dispatchers that see `backend` down.
    pub fn seen_down_by(&self, backend: &str) -> Vec<String> {
        self.members.values().filter(|m| m.down.iter().any(|d| d == backend)).map(|m| m.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/d/t";

    fn member_down(v: &mut View, name: &str, down: &[&str]) {
        let m = Member {
            name: name.into(),
            started: 1,
            pid: 2,
            version: "x".into(),
            down: down.iter().map(|d| d.to_string()).collect(),
            mac: Some(format!("02:00:00:00:00:{:02x}", name.len())),
            joined: name != "left",
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(v.apply(P, member_key(P, name).as_bytes(), Some(json.as_bytes())), Change::Verdicts);
    }

    fn member(v: &mut View, name: &str) {
        member_down(v, name, &[]);
    }

    fn verdict(v: &mut View, backend: &str, who: &str, down: bool) {
        let mut set: Vec<String> = v.members[who].down.clone();
        set.retain(|d| d != backend);
        if down {
            set.push(backend.to_string());
        }
        let set: Vec<&str> = set.iter().map(|s| s.as_str()).collect();
        member_down(v, who, &set);
    }

    #[test]
    fn steering_peers_are_the_joined_members_with_a_mac() {
        let mut v = View::default();
        member(&mut v, "d1");
        member(&mut v, "left");
        // An older dispatcher without a MAC steers nothing and owns nothing.
        let old = r#"{"name":"old","started":1,"pid":2,"version":"0"}"#;
        assert_eq!(v.apply(P, member_key(P, "old").as_bytes(), Some(old.as_bytes())), Change::Verdicts);
        let names: Vec<String> = v.steering_peers().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["d1"]);
    }

    #[test]
    fn out_needs_more_than_half_of_the_live_dispatchers() {
        let mut v = View::default();
        for m in ["d1", "d2", "d3"] {
            member(&mut v, m);
        }
        verdict(&mut v, "b0", "d1", true);
        assert!(!v.out_by_majority("b0"), "one of three");
        verdict(&mut v, "b0", "d2", true);
        assert!(v.out_by_majority("b0"), "two of three");
        verdict(&mut v, "b0", "d2", false);
        assert!(!v.out_by_majority("b0"));
        // A dispatcher whose lease expired no longer counts, either way.
        verdict(&mut v, "b0", "d2", true);
        v.apply(P, member_key(P, "d3").as_bytes(), None);
        assert!(v.out_by_majority("b0"), "two of two");
        assert_eq!(v.seen_down_by("b0"), vec!["d1".to_string(), "d2".to_string()]);
        v.apply(P, member_key(P, "d2").as_bytes(), None);
        assert!(v.out_by_majority("b0"), "one of one");
        v.apply(P, member_key(P, "d1").as_bytes(), None);
        assert!(!v.out_by_majority("b0"), "nobody live: nobody says so");
        member(&mut v, "d1");
        member(&mut v, "d2");
        verdict(&mut v, "b0", "d1", true);
        assert!(!v.out_by_majority("b0"), "one of two is not more than half");
        // Two of four is not a majority.
        let mut v = View::default();
        for m in ["a", "b", "c", "d"] {
            member(&mut v, m);
        }
        verdict(&mut v, "b0", "a", true);
        verdict(&mut v, "b0", "b", true);
        assert!(!v.out_by_majority("b0"));
        assert!(!v.out_by_majority("b1"), "another backend's verdicts are not this one's");
    }

    #[test]
    fn keys_parse_and_bad_values_are_ignored() {
        let mut v = View::default();
        assert_eq!(
            v.apply(P, operator_key(P, "b1").as_bytes(), Some(b"drain")),
            Change::Operator { backend: "b1".into(), op: Operator::Drain }
        );
        assert_eq!(v.operators.get("b1"), Some(&Operator::Drain));
        assert_eq!(
            v.apply(P, operator_key(P, "b1").as_bytes(), None),
            Change::Operator { backend: "b1".into(), op: Operator::None }
        );
        assert!(v.operators.is_empty());
        assert_eq!(v.apply(P, operator_key(P, "b1").as_bytes(), Some(b"melt")), Change::Ignored);
        assert_eq!(
            v.apply(P, clone_key(P, "C1").as_bytes(), Some(b"b2")),
            Change::Clone { id: "C1".into(), backend: "b2".into() }
        );
        assert_eq!(v.apply(P, b"/d/tx/members/a", Some(b"{}")), Change::Ignored, "another prefix");
        assert_eq!(v.apply(P, b"/d/t/members/a", Some(b"not json")), Change::Ignored);
        let forged = serde_json::to_string(&Member {
            name: "b".into(),
            started: 0,
            pid: 0,
            version: String::new(),
            down: vec![],
            mac: None,
            joined: true,
        })
        .unwrap();
        assert_eq!(v.apply(P, b"/d/t/members/a", Some(forged.as_bytes())), Change::Ignored, "name must match the key");
        assert_eq!(v.apply(P, b"/d/t/future/thing", Some(b"1")), Change::Ignored);
        assert_eq!(v.apply(P, &[0xff, 0xfe], Some(b"1")), Change::Ignored);
    }
}
