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

/// One line of a line chart: its name in the legend, its color (the series of one system
/// share one), its dash pattern (one per level set of that system) and its points (x, y).
struct Series {
    name: String,
    color: usize,
    dash: usize,
    points: Vec<(f64, f64)>,
}

/// Dash patterns: the first level set of a system solid, the next ones dashed, dotted.
const DASHES: [&str; 3] = ["", "8 4", "2 3"];
/// Width of the plot area of a line chart, and its left margin (the y tick labels).
const PLOT_W: f64 = 560.0;
const PLOT_LEFT: f64 = 80.0;
/// A generous width of one character at the 13 px font, to size the legend and check labels.
const CHAR_W: f64 = 7.5;
/// Vertical distance between legend entries, and the least between two labels.
const LEGEND_STEP: f64 = 20.0;
const LABEL_GAP: f64 = 16.0;

/// The smallest of 1, 2 and 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * mag).find(|v| *v >= raw * (1.0 - 1e-9)).unwrap_or(10.0 * mag)
}

/// The values 1, 2 and 5 times a power of ten from the largest at or below `lo` to the
/// smallest at or above `hi` (at least two).
fn ladder(lo: f64, hi: f64) -> Vec<f64> {
    let all: Vec<f64> = ((lo.log10().floor() as i32 - 1)..=(hi.log10().ceil() as i32 + 1))
        .flat_map(|d| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(d)))
        .collect();
    let first = all.iter().rposition(|v| *v <= lo * (1.0 + 1e-9)).unwrap_or(0);
    let last = all.iter().position(|v| *v >= hi * (1.0 - 1e-9)).unwrap_or(all.len() - 1).max(first + 1);
    all[first..=last].to_vec()
}

/// A tick value as written: the fewest decimals that write it exactly, thousands
/// separators in its integer part when it has no decimals.
fn tick(v: f64) -> String {
    let decimals = (0..=6)
        .find(|d| {
            let p = v * 10f64.powi(*d);
            (p.round() - p).abs() < 1e-6
        })
        .unwrap_or(6) as usize;
    if decimals > 0 {
        return format!("{v:.decimals$}");
    }
    let digits = format!("{:.0}", v.abs());
    let mut out = if v < 0.0 { String::from("-") } else { String::new() };
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Lines on a linear x axis and a logarithmic y axis (a value ten times larger is a fixed
/// distance higher), ticks at round values of x and at 1, 2 and 5 times the powers of ten
/// of y, the legend right of the plot, one entry a line, no label at the points. Points
/// with a y that is not positive cannot be placed on the axis and are left out; each
/// series is drawn in the order of x.
fn lines(title: &str, xlabel: &str, ylabel: &str, series: &[Series]) -> String {
    let series: Vec<(&Series, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| {
            let mut pts: Vec<(f64, f64)> =
                s.points.iter().copied().filter(|p| p.0.is_finite() && p.1.is_finite() && p.1 > 0.0).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (s, pts)
        })
        .filter(|s| !s.1.is_empty())
        .collect();
    let all = || series.iter().flat_map(|s| s.1.iter().copied());
    let (xmin, xmax) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (ymin, ymax) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (xmin, xmax, ymin, ymax) = if series.is_empty() { (0.0, 1.0, 1.0, 10.0) } else { (xmin, xmax, ymin, ymax) };
    // x: round bounds, 4 to 7 ticks.
    let span = if xmax > xmin { xmax - xmin } else { xmin.abs().max(1.0) };
    let step = nice_step(span / 5.0);
    let x0 = (xmin / step).floor() * step;
    let x1 = ((xmax / step).ceil() * step).max(x0 + step);
    // y: from the 1-2-5 value at or below the least to the one at or above the largest.
    let yticks = ladder(ymin, ymax);
    let (y0, y1) = (yticks[0], yticks[yticks.len() - 1]);
    let legend_w = series.iter().map(|s| s.0.name.chars().count()).max().unwrap_or(0) as f64 * CHAR_W + 50.0;
    let (l, r, t) = (PLOT_LEFT, PLOT_LEFT + PLOT_W, TOP);
    let w = r + 20.0 + legend_w;
    let h = H.max(t + LEGEND_STEP * series.len() as f64 + 60.0);
    let b = h - 60.0;
    let px = |x: f64| l + (x - x0) / (x1 - x0) * (r - l);
    let py = |y: f64| b - (y / y0).log10() / (y1 / y0).log10() * (b - t);
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="13"><rect width="100%" height="100%" fill="white"/><text class="title" x="{}" y="28" font-size="16" text-anchor="middle">{}</text><text class="axis" x="{}" y="{}" text-anchor="middle">{}</text><text class="axis" x="20" y="{}" transform="rotate(-90 20 {})" text-anchor="middle">{}</text>"##,
        w / 2.0,
        esc(title),
        (l + r) / 2.0,
        h - 18.0,
        esc(xlabel),
        (t + b) / 2.0,
        (t + b) / 2.0,
        esc(ylabel)
    );
    // y ticks: all of 1, 2, 5 while they stand far enough apart, else the powers of ten
    // (every k-th one if even those crowd).
    let decade = (b - t) / (y1 / y0).log10();
    let every = (LABEL_GAP / decade).ceil().max(1.0) as i32;
    for &y in &yticks {
        let e = y.log10().round() as i32;
        let power = (y / 10f64.powi(e) - 1.0).abs() < 1e-9;
        let shown = if decade * 2f64.log10() >= LABEL_GAP { true } else { power && e.rem_euclid(every) == 0 };
        if !shown {
            continue;
        }
        let _ = write!(
            s,
            r##"<line x1="{l}" y1="{:.1}" x2="{r}" y2="{:.1}" stroke="{}"/><text class="ytick" x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            py(y),
            py(y),
            if power { "#bbb" } else { "#e4e4e4" },
            l - 6.0,
            py(y) + 4.0,
            tick(y)
        );
    }
    let n = ((x1 - x0) / step).round() as usize;
    for k in 0..=n {
        let x = x0 + k as f64 * step;
        let _ = write!(
            s,
            r##"<line x1="{:.1}" y1="{b}" x2="{:.1}" y2="{}" stroke="black"/><text class="xtick" x="{:.1}" y="{}" text-anchor="middle">{}</text>"##,
            px(x),
            px(x),
            b + 5.0,
            px(x),
            b + 19.0,
            tick(x)
        );
    }
    let _ = write!(
        s,
        r#"<rect class="plot" x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="black"/>"#,
        r - l,
        b - t
    );
    for (i, (ser, pts)) in series.iter().enumerate() {
        let c = COLORS[ser.color % COLORS.len()];
        let dash = DASHES[ser.dash % DASHES.len()];
        let dash_attr = if dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{dash}""#) };
        // The first level set of a system filled points, the others hollow.
        let fill = if ser.dash == 0 { c } else { "white" };
        let path: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = write!(
            s,
            r#"<polyline class="series" points="{}" fill="none" stroke="{c}" stroke-width="2"{dash_attr}/>"#,
            path.join(" ")
        );
        for &(x, y) in pts {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{fill}" stroke="{c}" stroke-width="1.5"/>"#,
                px(x),
                py(y)
            );
        }
        let ly = t + 8.0 + LEGEND_STEP * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"{dash_attr}/><circle cx="{}" cy="{ly}" r="3.5" fill="{fill}" stroke="{c}" stroke-width="1.5"/><text class="legend" x="{}" y="{}">{}</text>"#,
            r + 20.0,
            r + 48.0,
            r + 34.0,
            r + 56.0,
            ly + 4.5,
            esc(&ser.name)
        );
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

/// A system's open-loop points at the shares of one maximum: (system, basis, points).
type LevelSet<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// The p99 chart of the HTTP bench's open-loop levels (`http.fixed_rate`): one series per
/// system and level set. A system is measured at shares of its own maximum and may be
/// measured at shares of another's too (the dispatcher at HAProxy's levels: the same
/// offered loads as HAProxy): two sets of offered loads, interleaved on the x axis, which
/// drawn as one line zig-zag between them. A level set is named by whose maximum it
/// shares (`basis`: `own_max`, `haproxy_max`; a row without one is at its own).
fn p99_chart(report: &Value) -> Option<String> {
    let fixed = report["http"]["fixed_rate"].as_array()?;
    // The level sets in the order first seen.
    let mut sets: Vec<LevelSet> = Vec::new();
    for f in fixed {
        let (Some(name), Some(x), Some(y)) = (f["system"].as_str(), f["offered_rps"].as_f64(), f["p99_ms"].as_f64())
        else {
            continue;
        };
        let basis = f["basis"].as_str().unwrap_or("own_max");
        match sets.iter_mut().find(|s| s.0 == name && s.1 == basis) {
            Some(s) => s.2.push((x, y)),
            None => sets.push((name, basis, vec![(x, y)])),
        }
    }
    if sets.is_empty() {
        return None;
    }
    let mut systems: Vec<&str> = Vec::new();
    for s in &sets {
        if !systems.contains(&s.0) {
            systems.push(s.0);
        }
    }
    let mut series = Vec::new();
    for (color, system) in systems.iter().enumerate() {
        // Its own levels first, then the others' in the order seen.
        let mut mine: Vec<&LevelSet> = sets.iter().filter(|s| s.0 == *system).collect();
        mine.sort_by_key(|s| s.1 != "own_max");
        for (dash, (_, basis, points)) in mine.into_iter().enumerate() {
            let whose = match basis.strip_suffix("_max").unwrap_or(basis) {
                "own" => "its own".to_string(),
                other => format!("{other}'s"),
            };
            let mut points = points.clone();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series { name: format!("{system} (% of {whose} max)"), color, dash, points });
        }
    }
    Some(lines(
        "HTTP: p99 latency at fixed offered loads (open loop)",
        "offered requests/s",
        "p99 ms (log scale)",
        &series,
    ))
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
    if let Some(svg) = p99_chart(report) {
        files.extend(write(dir, "http_p99", svg));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes of each `<tag …>` element of an SVG, in order, and its text (up to
    /// the next `<`).
    fn elements<'a>(svg: &'a str, tag: &str) -> Vec<(&'a str, &'a str)> {
        let open = format!("<{tag} ");
        svg.match_indices(&open)
            .map(|(i, _)| {
                let rest = &svg[i + open.len()..];
                let end = rest.find('>').unwrap();
                let text = &rest[end + 1..];
                (&rest[..end], &text[..text.find('<').unwrap_or(text.len())])
            })
            .collect()
    }

    /// An attribute's value (a whole name: `stroke` is not `stroke-width`, `x` not `cx`).
    fn attr<'a>(el: &'a str, name: &str) -> Option<&'a str> {
        let key = format!("{name}=\"");
        let mut from = 0;
        while let Some(i) = el[from..].find(&key) {
            let at = from + i;
            if at == 0 || el.as_bytes()[at - 1] == b' ' {
                let rest = &el[at + key.len()..];
                return Some(&rest[..rest.find('"')?]);
            }
            from = at + 1;
        }
        None
    }

    fn num(el: &str, name: &str) -> f64 {
        attr(el, name).unwrap().parse().unwrap()
    }

    /// The points of each polyline.
    fn polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
        elements(svg, "polyline")
            .iter()
            .map(|(el, _)| {
                attr(el, "points")
                    .unwrap()
                    .split(' ')
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    /// Text elements of a class: (x, y, text).
    fn texts(svg: &str, class: &str) -> Vec<(f64, f64, String)> {
        elements(svg, "text")
            .into_iter()
            .filter(|(el, _)| attr(el, "class") == Some(class))
            .map(|(el, t)| (num(el, "x"), num(el, "y"), t.to_string()))
            .collect()
    }

    /// A report as the HTTP bench writes it (rows per share: the dispatcher at its own
    /// maximum, HAProxy at its own, the dispatcher at HAProxy's), out of order within a
    /// series so that the chart must sort; the dispatcher's two level sets interleave on x.
    fn report() -> Value {
        let rows = [
            (90.0, "own_max", "dispatcher", 45_000.0, 50.0),
            (90.0, "own_max", "haproxy", 40_500.0, 20.0),
            (90.0, "haproxy_max", "dispatcher", 40_500.0, 5.0),
            (25.0, "own_max", "dispatcher", 12_500.0, 0.5),
            (25.0, "own_max", "haproxy", 11_250.0, 1.0),
            (25.0, "haproxy_max", "dispatcher", 11_250.0, 0.4),
            (50.0, "own_max", "dispatcher", 25_000.0, 0.5),
            (50.0, "own_max", "haproxy", 22_500.0, 2.0),
            (50.0, "haproxy_max", "dispatcher", 22_500.0, 0.8),
            (75.0, "own_max", "dispatcher", 37_500.0, 5.0),
            (75.0, "own_max", "haproxy", 33_750.0, 10.0),
            (75.0, "haproxy_max", "dispatcher", 33_750.0, 2.0),
        ];
        let fixed: Vec<Value> = rows
            .iter()
            .map(|&(share, basis, system, offered, p99)| {
                serde_json::json!({"share": share, "basis": basis, "system": system, "offered_rps": offered, "p99_ms": p99, "p50_ms": p99 / 2.0})
            })
            .collect();
        serde_json::json!({"http": {"fixed_rate": fixed}})
    }

    /// The data of each series as the chart should draw them: (name, points sorted by x).
    fn expected() -> Vec<(&'static str, Vec<(f64, f64)>)> {
        vec![
            (
                "dispatcher (% of its own max)",
                vec![(12_500.0, 0.5), (25_000.0, 0.5), (37_500.0, 5.0), (45_000.0, 50.0)],
            ),
            (
                "dispatcher (% of haproxy's max)",
                vec![(11_250.0, 0.4), (22_500.0, 0.8), (33_750.0, 2.0), (40_500.0, 5.0)],
            ),
            ("haproxy (% of its own max)", vec![(11_250.0, 1.0), (22_500.0, 2.0), (33_750.0, 10.0), (40_500.0, 20.0)]),
        ]
    }

    #[test]
    fn one_line_per_system_and_level_set() {
        let svg = p99_chart(&report()).unwrap();
        let lines = polylines(&svg);
        let want = expected();
        assert_eq!(lines.len(), want.len(), "one polyline per series");
        let legend = texts(&svg, "legend");
        let names: Vec<&str> = legend.iter().map(|l| l.2.as_str()).collect();
        let want_names: Vec<&str> = want.iter().map(|w| w.0).collect();
        assert_eq!(names, want_names);
        for (line, (name, pts)) in lines.iter().zip(&want) {
            assert_eq!(line.len(), pts.len(), "{name}: every point of its level set, no other");
            assert!(line.windows(2).all(|w| w[0].0 < w[1].0), "{name}: points in the order of x: {line:?}");
        }
        // The dispatcher's two level sets: one color, told apart by the dash.
        let strokes: Vec<(Option<&str>, Option<&str>)> = elements(&svg, "polyline")
            .iter()
            .map(|(el, _)| (attr(el, "stroke"), attr(el, "stroke-dasharray")))
            .collect();
        assert_eq!(strokes[0].0, strokes[1].0);
        assert_ne!(strokes[0].1, strokes[1].1);
        assert_ne!(strokes[0].0, strokes[2].0);
    }

    #[test]
    fn y_is_logarithmic_and_x_linear() {
        let svg = p99_chart(&report()).unwrap();
        let drawn: Vec<(f64, f64)> = polylines(&svg).concat();
        let data: Vec<(f64, f64)> = expected().into_iter().flat_map(|e| e.1).collect();
        assert_eq!(drawn.len(), data.len());
        // A value ten times larger is the same distance higher wherever it is.
        let (mut tenfold, mut decade) = (0, None::<f64>);
        for (i, a) in data.iter().enumerate() {
            for (j, b) in data.iter().enumerate() {
                if (b.1 / a.1 - 10.0).abs() < 1e-9 {
                    let up = drawn[i].1 - drawn[j].1;
                    let d = *decade.get_or_insert(up);
                    assert!((up - d).abs() < 0.25, "{} -> {}: {up} px, not {d}", a.1, b.1);
                    tenfold += 1;
                }
            }
        }
        assert!(tenfold >= 4, "the data hold tenfold pairs in and across series");
        let decade = decade.unwrap();
        assert!(decade > 60.0, "a decade is {decade} px");
        // And every other ratio in proportion to its logarithm; x in proportion to x.
        let (a, da) = (data[0], drawn[0]);
        let kx = (drawn[3].0 - da.0) / (data[3].0 - a.0);
        for (b, db) in data.iter().zip(&drawn) {
            assert!(((da.1 - db.1) - decade * (b.1 / a.1).log10()).abs() < 0.4, "y of {b:?}");
            assert!(((db.0 - da.0) - kx * (b.0 - a.0)).abs() < 0.25, "x of {b:?}");
        }
        // y ticks at 1, 2 and 5 times powers of ten, spanning the data (0.4 to 50 ms),
        // ten times larger a decade higher.
        let yt = texts(&svg, "ytick");
        let labels: Vec<&str> = yt.iter().map(|t| t.2.as_str()).collect();
        assert_eq!(labels, ["0.2", "0.5", "1", "2", "5", "10", "20", "50"]);
        let at = |v: &str| yt.iter().find(|t| t.2 == v).unwrap().1;
        assert!((at("0.5") - at("5") - decade).abs() < 0.25);
        assert!((at("1") - at("10") - decade).abs() < 0.25);
        // The point at 5 ms sits on the 5 ms tick's line (labels 4 px below it).
        assert!((drawn[2].1 - (at("5") - 4.0)).abs() < 0.15);
        // x ticks at round values, far enough apart for their labels.
        let xt = texts(&svg, "xtick");
        let xl: Vec<&str> = xt.iter().map(|t| t.2.as_str()).collect();
        assert_eq!(xl, ["10,000", "20,000", "30,000", "40,000", "50,000"]);
        for w in xt.windows(2) {
            let room = (w[0].2.len() + w[1].2.len()) as f64 * CHAR_W / 2.0;
            assert!(w[1].0 - w[0].0 > room + 8.0, "{:?} and {:?} overlap", w[0], w[1]);
        }
    }

    #[test]
    fn labels_do_not_collide() {
        let svg = p99_chart(&report()).unwrap();
        let plot = elements(&svg, "rect").into_iter().find(|(el, _)| attr(el, "class") == Some("plot")).unwrap().0;
        let right = num(plot, "x") + num(plot, "width");
        let legend = texts(&svg, "legend");
        assert_eq!(legend.len(), 3);
        for (i, a) in legend.iter().enumerate() {
            assert!(a.0 > right, "legend entry {} inside the plot", a.2);
            assert!(
                a.0 + a.2.len() as f64 * CHAR_W <= num(elements(&svg, "svg")[0].0, "width"),
                "legend entry {} cut off",
                a.2
            );
            for b in &legend[i + 1..] {
                assert!((a.1 - b.1).abs() >= LABEL_GAP, "legend entries {} and {} overlap", a.2, b.2);
            }
        }
        let yt = texts(&svg, "ytick");
        for w in yt.windows(2) {
            assert!((w[0].1 - w[1].1).abs() >= LABEL_GAP, "y ticks {} and {} overlap", w[0].2, w[1].2);
        }
        // No text but the title, the axis names, the ticks and the legend: no value
        // written at the points.
        for (el, t) in elements(&svg, "text") {
            let class = attr(el, "class").unwrap_or("");
            assert!(["title", "axis", "xtick", "ytick", "legend"].contains(&class), "stray label {t:?}");
        }
    }

    #[test]
    fn ticks() {
        assert_eq!(nice_step(6_750.0), 10_000.0);
        assert_eq!(nice_step(1_500.0), 2_000.0);
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(
            ladder(0.4, 50.0).iter().map(|v| tick(*v)).collect::<Vec<_>>(),
            ["0.2", "0.5", "1", "2", "5", "10", "20", "50"]
        );
        assert_eq!(ladder(3.0, 3.0).iter().map(|v| tick(*v)).collect::<Vec<_>>(), ["2", "5"]);
        assert_eq!(tick(0.1), "0.1");
        assert_eq!(tick(1.5), "1.5");
        assert_eq!(tick(-2_500.0), "-2,500");
        assert_eq!(tick(0.05), "0.05");
        assert_eq!(tick(1_000_000.0), "1,000,000");
        // Many decades: only the powers of ten are labelled, still apart.
        let series = vec![Series { name: "x".into(), color: 0, dash: 0, points: vec![(1.0, 0.001), (2.0, 1e6)] }];
        let svg = lines("t", "x", "y", &series);
        let yt = texts(&svg, "ytick");
        assert!(yt.iter().all(|t| t.2.trim_start_matches("0.").trim_matches(|c| c == '0' || c == ',') == "1"));
        for w in yt.windows(2) {
            assert!((w[0].1 - w[1].1).abs() >= LABEL_GAP);
        }
    }
}
