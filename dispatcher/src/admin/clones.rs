//! `GET /clones` and `POST /clones/delete?id=ID`: the clone table (and the SIP
//! logical-name table) listed a page at a time, and a learned entry forgotten.
//!
//! With `[cluster]`, a deletion is refused: the table is shared through etcd, and an ID
//! deleted here alone would be routed here otherwise than on the other dispatchers,
//! which still send its sessions to its owner; deleting the store key makes every
//! dispatcher forget it at once, so no request goes to a non-owner on one dispatcher
//! while the others keep the owner.

use crate::api::{CloneDeleted, CloneStatus, ClonesReply};
use crate::state::{CloneRow, Servers};

/// The most entries one page may hold.
pub const MAX_PAGE: usize = 10_000;

/// A query's `key=value` pairs, percent-decoded; a malformed escape is refused.
fn params(query: &str) -> Result<Vec<(String, String)>, String> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// `%XX` escapes decoded (the CLI escapes every byte an ID may hold that a query may not).
pub fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let v = hex.and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or_else(|| format!("bad %-escape in {s:?}"))?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

/// Every byte but letters, digits and `-._~` as `%XX`.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn status(servers: &Servers, r: CloneRow, now: u64) -> CloneStatus {
    let name = |b: usize| servers.backends.get(b).map_or_else(|| format!("#{b}"), |x| x.name.clone());
    let (kind, from) = r.origin.words();
    CloneStatus {
        id: r.id,
        backend: name(r.owner),
        replica: r.replica.map(name),
        kind: kind.into(),
        from: from.into(),
        age_s: (r.since != 0).then(|| now.saturating_sub(r.since)),
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `GET /clones?table=clones|sip&offset=N&limit=N` (limit 100 by default, at most
/// `MAX_PAGE`).
pub fn list(servers: &Servers, query: &str) -> Result<ClonesReply, String> {
    let (mut sip, mut offset, mut limit) = (false, 0usize, 100usize);
    for (k, v) in params(query)? {
        let number = |v: &str| v.parse::<usize>().map_err(|_| format!("{k}={v:?}: a number of entries"));
        match k.as_str() {
            "table" if v == "sip" || v == "clones" => sip = v == "sip",
            "table" => return Err(format!("table={v:?}: clones or sip")),
            "offset" => offset = number(&v)?,
            "limit" => limit = number(&v)?,
            _ => return Err(format!("unknown parameter {k:?}: table, offset, limit")),
        }
    }
    if limit == 0 || limit > MAX_PAGE {
        return Err(format!("limit={limit}: 1 to {MAX_PAGE} entries a page"));
    }
    let (total, rows) = servers.clone_rows(sip, offset, limit);
    let now = now();
    let entries = rows.into_iter().map(|r| status(servers, r, now)).collect();
    Ok(ClonesReply { table: if sip { "sip" } else { "clones" }.into(), total, offset, entries })
}

/// `POST /clones/delete?id=ID`; `cluster_prefix`: `[cluster]`'s key prefix (refused then).
pub fn delete(servers: &Servers, query: &str, cluster_prefix: Option<&str>) -> Result<CloneDeleted, String> {
    let id = params(query)?.into_iter().find(|(k, _)| k == "id").map(|(_, v)| v);
    let Some(id) = id.filter(|i| !i.is_empty()) else { return Err("say which entry: ?id=ID".into()) };
    if let Some(prefix) = cluster_prefix {
        return Err(format!(
            "this dispatcher shares its clone table through etcd ([cluster]): deleted here alone, {id:?} would be routed here otherwise than on the other dispatchers; nothing deleted. Delete the store key {} instead (every dispatcher forgets it)",
            crate::shared::view::clone_key(prefix, &id)
        ));
    }
    let force = params(query)?.into_iter().any(|(k, v)| k == "force" && (v == "true" || v == "1"));
    let row = servers.delete_learned(&id, force)?;
    tracing::info!(clone = %row.id, "clone table entry deleted by the operator");
    Ok(CloneDeleted { deleted: status(servers, row, now()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_travel_percent_encoded() {
        for id in ["clone2x", "a/b?c&d=e%f#g", "x y"] {
            assert_eq!(decode(&encode(id)).unwrap(), id);
        }
        assert_eq!(encode("a/b"), "a%2Fb");
        assert!(decode("%zz").is_err() && decode("%4").is_err());
        assert_eq!(
            params("id=a%26b&table=sip").unwrap(),
            [("id".into(), "a&b".into()), ("table".into(), "sip".into())]
        );
    }

    /// With `[cluster]` nothing is deleted here alone; the refusal names the store key.
    #[test]
    fn a_shared_table_is_not_deleted_from_here_alone() {
        let text = "[dispatcher]\ninterface = \"lo\"\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.1\"\n";
        let cfg = crate::config::Config::parse(text, "t").unwrap();
        let servers = Servers::new(&cfg, &[], &[], None);
        servers.learn(b"cx", 0);
        let why = delete(&servers, "id=cx", Some("/dispatcher/shop")).unwrap_err();
        assert!(why.contains("nothing deleted. Delete the store key /dispatcher/shop/clones/cx instead"), "{why}");
        assert_eq!(servers.owner(b"cx").map(|o| o.0), Some(0), "still routed to its owner");
        assert!(delete(&servers, "id=cx", None).unwrap_err().contains("can serve its sessions"), "its owner is up");
        assert_eq!(delete(&servers, "id=cx&force=true", None).unwrap().deleted.backend, "a");
        assert_eq!(delete(&servers, "", None).unwrap_err(), "say which entry: ?id=ID");
        assert!(list(&servers, "limit=0").unwrap_err().starts_with("limit=0: 1 to 10000"));
        assert!(list(&servers, "table=x").is_err() && list(&servers, "nope=1").is_err());
    }
}
