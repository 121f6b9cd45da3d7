//! The status table as CSV (`dispatcher status --csv`, `GET /status?format=csv`), for
//! `cut`, spreadsheets and scripts, as HAProxy's `show stat`: one header line, then one
//! row per VIP (its FRONTEND) and one per backend, with the fields `dispatcher status`
//! shows. Fields are quoted as RFC 4180 says (a field with a comma, a quote, CR or LF is
//! put in double quotes, its quotes doubled); lines end with LF. An empty field: not
//! known (no agent answered, or not a field of that kind of row).

use std::fmt::Write as _;

use dispatcher_common::{stats, BackendState};

use crate::{api::AgentStatus, config::Config, dataplane::tables::Tables};

/// The columns, in order.
pub const HEADER: &[&str] = &[
    "type",
    "name",
    "address",
    "mode",
    "state",
    "health",
    "operator",
    "weight",
    "replica",
    "packets",
    "bytes",
    "new_flows",
    "flow_hits",
    "drops",
    "requests",
    "connections",
    "active",
    "errors",
    "last_change",
    "last_change_unix",
];

/// One field as RFC 4180 writes it.
pub fn field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

/// One line: the fields quoted, joined by commas, ended by LF.
pub fn line(o: &mut String, fields: &[String]) {
    let quoted: Vec<_> = fields.iter().map(|f| field(f)).collect();
    let _ = writeln!(o, "{}", quoted.join(","));
}

/// The table from the maps (`tables`, the ids of `cfg`) and what the agent adds when it
/// answered (`agent`).
pub fn status_csv(
    cfg: &Config,
    tables: &Tables,
    agent: Option<&AgentStatus>,
) -> Result<String, crate::dataplane::DataplaneError> {
    let mut o = String::new();
    line(&mut o, &HEADER.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    let n = |v: u64| v.to_string();
    for (i, v) in cfg.vips.iter().enumerate() {
        let id = i as u32;
        let c = |what| tables.counter(stats::vip_slot(id, what)).map(|c| c.packets);
        let fwd = tables.vip_forwarded(id)?;
        let a = agent.and_then(|a| a.vips.iter().find(|x| x.name == v.name));
        let mut row = vec![String::new(); HEADER.len()];
        row[0] = "vip".into();
        row[1] = v.name.clone();
        row[2] = format!("{}:{}/{:?}", v.address, v.port, v.protocol).to_lowercase();
        row[3] = format!("{:?}", v.mode()).to_lowercase();
        row[9] = n(fwd.packets);
        row[10] = n(fwd.bytes);
        row[11] = n(c(stats::VIP_NEW_FLOWS)?);
        row[12] = n(c(stats::VIP_FLOW_HITS)?);
        row[13] = n(c(stats::VIP_DROPS)?);
        if let Some(a) = a {
            row[14] = n(a.requests);
            row[15] = n(a.connections);
        }
        line(&mut o, &row);
    }
    for (i, b) in cfg.backends.iter().enumerate() {
        let id = i as u32;
        let info = tables.backend(id)?;
        let pk = tables.counter(stats::backend_slot(id, stats::BACKEND_PACKETS))?;
        let nf = tables.counter(stats::backend_slot(id, stats::BACKEND_NEW_FLOWS))?;
        let a = agent.and_then(|a| a.backends.iter().find(|x| x.name == b.name));
        let mut row = vec![String::new(); HEADER.len()];
        row[0] = "backend".into();
        row[1] = b.name.clone();
        row[2] = b.address.to_string();
        row[4] = BackendState::from_u8(info.state).name().into();
        row[6] = match info.admin {
            0 => "none".into(),
            x => BackendState::from_u8(x).name().into(),
        };
        row[7] = n(info.weight.into());
        row[8] = b.replica.and_then(|r| cfg.backends.get(r)).map(|r| r.name.clone()).unwrap_or_default();
        row[9] = n(pk.packets);
        row[10] = n(pk.bytes);
        row[11] = n(nf.packets);
        if let Some(a) = a {
            row[5] = a.health.clone();
            row[14] = n(a.requests);
            row[15] = n(a.connections);
            row[16] = n(a.active);
            row[17] = n(a.errors);
            if let Some(c) = &a.last_change {
                row[18] = format!("{} -> {}: {}", c.from, c.to, c.reason);
                row[19] = n(c.at_unix);
            }
        }
        line(&mut o, &row);
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_as_rfc_4180_says() {
        assert_eq!(field("b0"), "b0");
        assert_eq!(field(""), "");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("two\nlines"), "\"two\nlines\"");
        assert_eq!(field("cr\r"), "\"cr\r\"");
        let mut o = String::new();
        line(&mut o, &["up -> down: status 503, twice".into(), "x\"y".into(), String::new(), "7".into()]);
        assert_eq!(o, "\"up -> down: status 503, twice\",\"x\"\"y\",,7\n");
    }
}
