//! Charts of the report: SVG drawn here, turned into PNG by `rsvg-convert` (Debian's
//! librsvg2-bin, which `cargo xtask bench` installs).

use std::{fmt::Write as _, path::Path};

use serde_json::Value;

const W: f64 = 760.0;
const H: f64 = 420.0;
const LEFT: f64 = 230.0;
const TOP: f64 = 50.0;
const COLORS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Horizontal bars: one per (label, value).
fn bars(title: &str, unit: &str, rows: &[(String, f64)]) -> String {
    let max = rows.iter().map(|r| r.1).fold(0.0, f64::max).max(1e-9);
    // Small values (milliseconds) keep two decimals.
    let prec = if max < 100.0 { 2 } else { 0 };
    let bar_h = ((H - TOP - 30.0) / rows.len().max(1) as f64).min(36.0);
    // Room for the longest label (about 7 px a character at this size): the picture
    // widens rather than cut labels off.
    let longest = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0) as f64;
    let left = LEFT.max(longest * 7.0 + 16.0);
    let width = W + left - LEFT;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" font-family="sans-serif" font-size="13"><rect width="100%" height="100%" fill="white"/><text x="{}" y="28" font-size="16" text-anchor="middle">{}</text>"#,
        width / 2.0,
        esc(title)
    );
    for (i, (label, v)) in rows.iter().enumerate() {
        let y = TOP + i as f64 * bar_h;
        let w = (W - LEFT - 90.0) * v / max;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text><rect x="{left}" y="{}" width="{w:.1}" height="{}" fill="{}"/><text x="{}" y="{}">{v:.prec$} {}</text>"#,
            left - 8.0,
            y + bar_h * 0.6,
            esc(label),
            y + 3.0,
            bar_h - 6.0,
            COLORS[i % COLORS.len()],
            left + w + 6.0,
            y + bar_h * 0.6,
            esc(unit)
        );
    }
    s + "</svg>"
}

/// Lines: for each series, points (x, y).
fn lines(title: &str, xlabel: &str, ylabel: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let xs = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.1.iter().map(|p| p.1));
    let (xmin, xmax) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let ymax = ys.fold(0.0, f64::max).max(1e-9) * 1.1;
    let (l, r, t, b) = (80.0, W - 170.0, TOP, H - 50.0);
    let px = |x: f64| l + (x - xmin) / (xmax - xmin).max(1e-9) * (r - l);
    let py = |y: f64| b - y / ymax * (b - t);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="13"><rect width="100%" height="100%" fill="white"/><text x="{}" y="28" font-size="16" text-anchor="middle">{}</text><line x1="{l}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/><line x1="{l}" y1="{t}" x2="{l}" y2="{b}" stroke="black"/><text x="{}" y="{}" text-anchor="middle">{}</text><text x="20" y="{}" transform="rotate(-90 20 {})" text-anchor="middle">{}</text>"#,
        W / 2.0,
        esc(title),
        (l + r) / 2.0,
        H - 12.0,
        esc(xlabel),
        (t + b) / 2.0,
        (t + b) / 2.0,
        esc(ylabel)
    );
    for k in 0..=4 {
        let y = ymax * k as f64 / 4.0;
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{y:.1}</text><line x1="{l}" y1="{}" x2="{r}" y2="{}" stroke="#ddd"/>"##,
            l - 6.0,
            py(y) + 4.0,
            py(y),
            py(y)
        );
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = write!(s, r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#, path.join(" "));
        for &(x, y) in pts {
            let _ = write!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#, px(x), py(y));
        }
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
            r + 15.0,
            t + 20.0 * i as f64,
            r + 32.0,
            t + 11.0 + 20.0 * i as f64,
            esc(name)
        );
    }
    for pt in series.first().map(|s| s.1.clone()).unwrap_or_default() {
        let _ = write!(s, r#"<text x="{:.1}" y="{}" text-anchor="middle">{:.0}</text>"#, px(pt.0), b + 16.0, pt.0);
    }
    s + "</svg>"
}

fn write(dir: &Path, name: &str, svg: String) -> Vec<String> {
    let svg_path = dir.join(format!("{name}.svg"));
    let png_path = dir.join(format!("{name}.png"));
    if std::fs::write(&svg_path, svg).is_err() {
        return Vec::new();
    }
    let ok = std::process::Command::new("rsvg-convert")
        .arg("-o")
        .arg(&png_path)
        .arg(&svg_path)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        vec![png_path.display().to_string()]
    } else {
        eprintln!("    (rsvg-convert not available: {} left as SVG)", svg_path.display());
        vec![svg_path.display().to_string()]
    }
}

/// Draws what the report holds; returns the files written.
pub fn draw(report: &Value, dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    if let Some(cases) = report["xdp"]["cases"].as_array() {
        let rows: Vec<(String, f64)> = cases
            .iter()
            .filter_map(|c| Some((c["case"].as_str()?.to_string(), c["above_floor_ns"].as_f64()?)))
            .collect();
        files.extend(write(
            dir,
            "xdp_ns",
            bars("XDP: ns/packet above the XDP_PASS floor (single-shot median)", "ns", &rows),
        ));
    }
    if let Some(systems) = report["http"]["systems"].as_array() {
        let rows: Vec<(String, f64)> =
            systems.iter().filter_map(|s| Some((s["system"].as_str()?.to_string(), s["rps"].as_f64()?))).collect();
        files.extend(write(dir, "http_rps", bars("HTTP: requests/s at full load (wrk, same workers)", "req/s", &rows)));
    }
    if let Some(fixed) = report["http"]["fixed_rate"].as_array() {
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for f in fixed {
            let (Some(name), Some(x), Some(y)) =
                (f["system"].as_str(), f["offered_rps"].as_f64(), f["p99_ms"].as_f64())
            else {
                continue;
            };
            match series.iter_mut().find(|s| s.0 == name) {
                Some(s) => s.1.push((x, y)),
                None => series.push((name.to_string(), vec![(x, y)])),
            }
        }
        for s in &mut series {
            s.1.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        files.extend(write(
            dir,
            "http_p99",
            lines("HTTP: p99 latency at fixed offered loads (open loop)", "offered requests/s", "p99 ms", &series),
        ));
    }
    if let Some(fixed) = report["http"]["fixed_rate"].as_array() {
        // Latency percentiles per system at half of its own maximum.
        let mut rows = Vec::new();
        for f in fixed.iter().filter(|f| f["basis"] == "own_max" && f["share"].as_f64() == Some(50.0)) {
            let name = f["system"].as_str().unwrap_or("?");
            for (label, key) in [("p50", "p50_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms")] {
                if let Some(v) = f[key].as_f64() {
                    rows.push((format!("{name} {label}"), v));
                }
            }
        }
        if !rows.is_empty() {
            let title = "HTTP: latency percentiles at 50% of each system's maximum (open loop)";
            files.extend(write(dir, "http_latency", bars(title, "ms", &rows)));
        }
    }
    if let Some(conc) = report["http"]["concurrency"].as_array() {
        let rows: Vec<(String, f64)> = conc
            .iter()
            .filter_map(|c| {
                Some((format!("{}, {} conns", c["system"].as_str()?, c["connections"].as_u64()?), c["rps"].as_f64()?))
            })
            .collect();
        let title = "HTTP: requests/s with 10, 1,000 and 10,000 client connections";
        files.extend(write(dir, "http_concurrency", bars(title, "req/s", &rows)));
    }
    if let Some(l4) = report["l4"].as_array() {
        let rows: Vec<(String, f64)> = l4
            .iter()
            .filter_map(|s| Some((s["system"].as_str()?.to_string(), s["connections_per_s"].as_f64()?)))
            .collect();
        files.extend(write(dir, "l4_cps", bars("L4: TCP connections/s", "conn/s", &rows)));
    }
    files
}
