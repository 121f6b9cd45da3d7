//! One result row, rendered both as a Markdown table row (report.md) and as a JSON object
//! (report.json): each cell has its column title and its key, and its value written for
//! each. A cell without a title is in the JSON only (a figure the table leaves out); one
//! without a key is in the table only (a ratio to a peer, a range written out).

use std::{fmt::Display, sync::Mutex};

/// What a bench could not measure (a system that did not speak the protocol, requests
/// that failed): its figures are left out of the report, and the bench program exits
/// with an error once the report is written.
static FAILURES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records a failure (and says so on stderr at once).
pub fn fail(what: String) {
    eprintln!("    FAILED: {what}");
    FAILURES.lock().unwrap_or_else(|e| e.into_inner()).push(what);
}

/// The failures recorded so far.
pub fn failures() -> Vec<String> {
    FAILURES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

struct Cell {
    title: &'static str,
    key: &'static str,
    numeric: bool,
    md: String,
    json: String,
}

#[derive(Default)]
pub struct Row {
    cells: Vec<Cell>,
}

impl Row {
    pub fn new() -> Row {
        Row::default()
    }

    fn cell(mut self, title: &'static str, key: &'static str, numeric: bool, md: String, json: String) -> Row {
        self.cells.push(Cell { title, key, numeric, md, json });
        self
    }

    /// Text (a JSON string).
    pub fn text(self, title: &'static str, key: &'static str, v: impl Display) -> Row {
        let v = v.to_string();
        let json = serde_json::Value::String(v.clone()).to_string();
        self.cell(title, key, false, v, json)
    }

    /// A number with `md` decimals in the table and `json` decimals in the JSON (`null`
    /// when it is not finite: a run that measured nothing leaves the report readable).
    pub fn num(self, title: &'static str, key: &'static str, v: f64, md: usize, json: usize) -> Row {
        let j = if v.is_finite() { format!("{v:.json$}") } else { "null".into() };
        self.cell(title, key, true, format!("{v:.md$}"), j)
    }

    /// A count (any integer).
    pub fn int(self, title: &'static str, key: &'static str, v: impl Display) -> Row {
        self.cell(title, key, true, v.to_string(), v.to_string())
    }

    /// A number that may be missing: `-` in the table, `null` in the JSON.
    pub fn opt(self, title: &'static str, key: &'static str, v: Option<f64>, md: usize, json: usize) -> Row {
        match v {
            Some(v) => self.num(title, key, v, md, json),
            None => self.cell(title, key, true, "-".into(), "null".into()),
        }
    }

    /// A cell of the table only, as written (right-aligned when it starts with a figure).
    pub fn md(self, title: &'static str, v: impl Display) -> Row {
        let v = v.to_string();
        let numeric = v.starts_with(|c: char| c.is_ascii_digit() || c == '-');
        self.cell(title, "", numeric, v, String::new())
    }

    /// A field of the JSON only: a JSON value as written.
    pub fn json(self, key: &'static str, v: impl Display) -> Row {
        self.cell("", key, true, String::new(), v.to_string())
    }
}

/// The rows as a Markdown table (the columns of the first row).
pub fn markdown(rows: &[Row]) -> String {
    let Some(first) = rows.first() else { return String::new() };
    let cols = |r: &Row| {
        r.cells.iter().filter(|c| !c.title.is_empty()).map(|c| (c.title, c.numeric, c.md.clone())).collect::<Vec<_>>()
    };
    let head = cols(first);
    let mut s = format!("| {} |\n", head.iter().map(|c| c.0).collect::<Vec<_>>().join(" | "));
    s += &format!("|{}|\n", head.iter().map(|c| if c.1 { "---:" } else { "---" }).collect::<Vec<_>>().join("|"));
    for r in rows {
        s += &format!("| {} |\n", cols(r).into_iter().map(|c| c.2).collect::<Vec<_>>().join(" | "));
    }
    s
}

/// The rows as a JSON array of objects.
pub fn json(rows: &[Row]) -> String {
    let objects: Vec<String> = rows
        .iter()
        .map(|r| {
            let fields: Vec<String> =
                r.cells.iter().filter(|c| !c.key.is_empty()).map(|c| format!(r#""{}":{}"#, c.key, c.json)).collect();
            format!("{{{}}}", fields.join(","))
        })
        .collect();
    format!("[{}]", objects.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_two_renderings() {
        let rows = vec![
            Row::new()
                .text("system", "system", "a\"b")
                .num("req/s", "rps", 1234.56, 0, 1)
                .md("vs b", "1.00")
                .json("raw", 7),
            Row::new().text("system", "system", "c").opt("req/s", "rps", None, 0, 1).md("vs b", "0.50").json("raw", 8),
        ];
        assert_eq!(
            markdown(&rows),
            "| system | req/s | vs b |\n|---|---:|---:|\n| a\"b | 1235 | 1.00 |\n| c | - | 0.50 |\n"
        );
        assert_eq!(json(&rows), r#"[{"system":"a\"b","rps":1234.6,"raw":7},{"system":"c","rps":null,"raw":8}]"#);
        let v: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        assert_eq!(v[0]["rps"], 1234.6);
        assert_eq!(json(&[Row::new().num("x", "x", f64::NAN, 0, 1)]), r#"[{"x":null}]"#);
    }
}
