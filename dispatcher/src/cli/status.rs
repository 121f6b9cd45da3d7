use std::{path::Path, process::ExitCode};

use anyhow::Context as _;
use dispatcher::{config::Config, dataplane::tables::Tables};
use dispatcher_common::stats;

pub use dispatcher::control::state_name;

pub fn status(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    let dir = cfg.pin_dir();
    let tables = Tables::from_pinned(&dir)
        .with_context(|| format!("opening the maps pinned under {} (is the dispatcher loaded?)", dir.display()))?;
    let flow_count = tables.flow_count();

    let mut vip_rows = Vec::new();
    for (i, v) in cfg.vips.iter().enumerate() {
        let id = i as u32;
        let c = |what| tables.counter(stats::vip_slot(id, what));
        vip_rows.push((
            v,
            c(stats::VIP_PACKETS)?,
            c(stats::VIP_NEW_FLOWS)?.packets,
            c(stats::VIP_FLOW_HITS)?.packets,
            c(stats::VIP_DROPS)?.packets,
        ));
    }
    let mut be_rows = Vec::new();
    for (i, b) in cfg.backends.iter().enumerate() {
        let id = i as u32;
        let info = tables.backend(id)?;
        let pk = tables.counter(stats::backend_slot(id, stats::BACKEND_PACKETS))?;
        let nf = tables.counter(stats::backend_slot(id, stats::BACKEND_NEW_FLOWS))?;
        be_rows.push((b, info, pk, nf.packets));
    }
    let globals: Vec<(&str, u64)> = tables.global_counters()?.into_iter().map(|(n, c)| (n, c.packets)).collect();

    if json {
        let vips: Vec<String> = vip_rows
            .iter()
            .map(|(v, p, nf, hits, drops)| format!(r#"{{"name":"{}","address":"{}","port":{},"packets":{},"bytes":{},"new_flows":{},"flow_hits":{},"drops":{}}}"#, v.name, v.address, v.port, p.packets, p.bytes, nf, hits, drops))
            .collect();
        let bes: Vec<String> = be_rows
            .iter()
            .map(|(b, info, pk, nf)| {
                format!(
                    r#"{{"name":"{}","address":"{}","state":"{}","weight":{},"packets":{},"bytes":{},"new_flows":{}}}"#,
                    b.name,
                    b.address,
                    state_name(info.state),
                    info.weight,
                    pk.packets,
                    pk.bytes,
                    nf
                )
            })
            .collect();
        let gl: Vec<String> = globals.iter().map(|(n, v)| format!(r#""{n}":{v}"#)).collect();
        println!(
            r#"{{"instance":"{}","flows":{},"vips":[{}],"backends":[{}],"xdp":{{{}}}}}"#,
            cfg.instance,
            flow_count,
            vips.join(","),
            bes.join(","),
            gl.join(",")
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("instance {}  (maps pinned under {})  flows in table: {}", cfg.instance, dir.display(), flow_count);
    println!();
    println!(
        "{:<16} {:<28} {:>12} {:>14} {:>10} {:>10} {:>8}",
        "VIP", "ADDRESS", "PACKETS", "BYTES", "NEW FLOWS", "FLOW HITS", "DROPS"
    );
    for (v, p, nf, hits, drops) in &vip_rows {
        let addr = format!("{}:{}/{:?}", v.address, v.port, v.protocol).to_lowercase();
        println!("{:<16} {:<28} {:>12} {:>14} {:>10} {:>10} {:>8}", v.name, addr, p.packets, p.bytes, nf, hits, drops);
    }
    println!();
    println!(
        "{:<16} {:<16} {:<9} {:>6} {:<16} {:>12} {:>10}",
        "BACKEND", "ADDRESS", "STATE", "WEIGHT", "REPLICA", "PACKETS", "NEW FLOWS"
    );
    for (b, info, pk, nf) in &be_rows {
        let replica = b.replica.map(|r| cfg.backends[r].name.as_str()).unwrap_or("-");
        println!(
            "{:<16} {:<16} {:<9} {:>6} {:<16} {:>12} {:>10}",
            b.name,
            b.address.to_string(),
            state_name(info.state),
            info.weight,
            replica,
            pk.packets,
            nf
        );
    }
    println!();
    let nonzero: Vec<String> = globals.iter().filter(|(_, v)| *v > 0).map(|(n, v)| format!("{n}={v}")).collect();
    println!("xdp: {}", if nonzero.is_empty() { "no pass/drop events".to_string() } else { nonzero.join(" ") });
    Ok(ExitCode::SUCCESS)
}
