//! What the running agent keeps in its tables, shown and (the clone table) edited through
//! its admin socket: `errors` (the last refused requests) and `clones` (the clone and
//! logical-name tables; `clones delete ID`).

use std::{fmt::Write as _, path::Path, process::ExitCode};

use anyhow::Context as _;
use dispatcher::{
    admin::client::{explain, refusal, request},
    api::ErrorsReply,
    config::Config,
};

/// One request to the agent: its answer's body when it answered 200, else why not.
fn ask(cfg: &Config, method: &str, target: &str) -> anyhow::Result<Result<String, String>> {
    let (code, body) =
        request(&cfg.admin_socket, method, target).map_err(|e| anyhow::anyhow!(explain(&e, &cfg.instance)))?;
    Ok(if code == 200 { Ok(body) } else { Err(refusal(&body)) })
}

/// `dispatcher errors`: the last requests refused as malformed, readable.
pub fn errors(path: &Path) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    let body = match ask(&cfg, "GET", "/errors")? {
        Ok(body) => body,
        Err(why) => anyhow::bail!("the agent refused: {why}"),
    };
    let r: ErrorsReply = serde_json::from_str(&body).context("the agent's answer to GET /errors")?;
    print!("{}", render_errors(&r));
    Ok(ExitCode::SUCCESS)
}

/// A header line, then per refusal one line (when, VIP, client, protocol, status, why,
/// where) and what arrived, escaped, one line of the head per line.
fn render_errors(r: &ErrorsReply) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} requests refused as malformed since the agent started; the last {} are kept, oldest first",
        r.total, r.kept
    );
    for e in &r.errors {
        let at = e.position.map(|p| format!(" at byte {p}")).unwrap_or_default();
        let cut = if e.captured < e.received { format!(", the first {} shown", e.captured) } else { String::new() };
        let _ = writeln!(
            o,
            "\n{} VIP {} client {} {}: answered {}: {}{at} ({} bytes received{cut})",
            e.at, e.vip, e.client, e.protocol, e.status, e.reason, e.received
        );
        for line in e.bytes.split_inclusive("\\x0a") {
            let _ = writeln!(o, "    {line}");
        }
    }
    o
}

/// `dispatcher clones [--sip] [--offset N] [--limit N]`, or `dispatcher clones delete ID`.
pub fn clones(
    path: &Path,
    delete: Option<&str>,
    force: bool,
    sip: bool,
    offset: usize,
    limit: usize,
) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    if let Some(id) = delete {
        let force = if force { "&force=true" } else { "" };
        let target = format!("/clones/delete?id={}{force}", dispatcher::admin::clones::encode(id));
        return match ask(&cfg, "POST", &target)? {
            Ok(body) => {
                let r: dispatcher::api::CloneDeleted = serde_json::from_str(&body).context("the agent's answer")?;
                let d = &r.deleted;
                println!(
                    "deleted {} ({} from {}, backend {}): the next request carrying it is routed as an unknown ID, and its owner's next answer teaches it again",
                    d.id, d.kind, d.from, d.backend
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(why) => {
                eprintln!("clones delete {id}: {why}");
                Ok(ExitCode::from(1))
            }
        };
    }
    let target = format!("/clones?table={}&offset={offset}&limit={limit}", if sip { "sip" } else { "clones" });
    let body = match ask(&cfg, "GET", &target)? {
        Ok(body) => body,
        Err(why) => anyhow::bail!("the agent refused: {why}"),
    };
    let r: dispatcher::api::ClonesReply = serde_json::from_str(&body).context("the agent's answer to GET /clones")?;
    print!("{}", render_clones(&r));
    Ok(ExitCode::SUCCESS)
}

/// A header line (how many, which are shown), then one aligned row per entry.
fn render_clones(r: &dispatcher::api::ClonesReply) -> String {
    let what = if r.table == "sip" { "SIP logical-name table" } else { "clone table" };
    let mut o = String::new();
    let shown = match r.entries.len() {
        0 => "none shown".to_string(),
        n => format!("{} to {} shown", r.offset + 1, r.offset + n),
    };
    let _ = writeln!(o, "{what}: {} entries ({shown}, sorted by ID)", r.total);
    if r.entries.is_empty() {
        return o;
    }
    let w = r.entries.iter().map(|e| e.id.len()).max().unwrap_or(2).max(2);
    let _ = writeln!(o, "{:<w$}  {:<12} {:<12} {:<10} {:<22} AGE", "ID", "BACKEND", "REPLICA", "KIND", "FROM");
    for e in &r.entries {
        let age = e.age_s.map_or_else(|| "-".to_string(), |s| format!("{s} s"));
        let replica = e.replica.as_deref().unwrap_or("-");
        let _ = writeln!(o, "{:<w$}  {:<12} {:<12} {:<10} {:<22} {age}", e.id, e.backend, replica, e.kind, e.from);
    }
    if r.offset + r.entries.len() < r.total {
        let next = r.offset + r.entries.len();
        let _ = writeln!(o, "... {} more (--offset {next})", r.total - next);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_shown_line_by_line() {
        let e = dispatcher::api::RefusedRequest {
            at: "2026-12-03T12:00:00.000Z".into(),
            vip: "app".into(),
            client: "10.0.0.2:4000".into(),
            protocol: "h1".into(),
            status: 400,
            reason: "bare LF".into(),
            position: Some(14),
            received: 27,
            captured: 27,
            bytes: "GET / HTTP/1.1\\x0aHost: x\\x0a\\x0a".into(),
        };
        let r = ErrorsReply { total: 40, kept: 32, errors: vec![e] };
        assert_eq!(
            render_errors(&r),
            "40 requests refused as malformed since the agent started; the last 32 are kept, oldest first\n\n\
             2026-12-03T12:00:00.000Z VIP app client 10.0.0.2:4000 h1: answered 400: bare LF at byte 14 (27 bytes received)\n    \
             GET / HTTP/1.1\\x0a\n    Host: x\\x0a\n    \\x0a\n"
        );
    }
}
