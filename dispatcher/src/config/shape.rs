//! The file's shape errors (what serde and the TOML parser refuse before validation: a
//! value of the wrong type or out of range, an unknown or a missing field) in the words
//! validation uses: `section[i].field: expected ..., got ...`, with the fix when one is
//! obvious (`write 80 without quotes`, `did you mean `weight`?`).
//!
//! The parser's error has the span of the value, of the unknown key or of the table that
//! lacks a field, and serde's message; the section and the field are found from the
//! span's place in the text (`locate`).

/// `ConfigError::Invalid`'s line and message for a parse error of `text`.
pub(super) fn explain(text: &str, span: Option<std::ops::Range<usize>>, message: &str) -> (usize, String) {
    let message = message.trim();
    let at = span.as_ref().map_or(0, |s| s.start.min(text.len()));
    let line = text[..at].bytes().filter(|&b| b == b'\n').count() + 1;
    // An empty span is the document's (a missing section): no table's.
    let place = match &span {
        Some(s) if !s.is_empty() => locate(text, at),
        _ => Place::default(),
    };
    let got_text = span.as_ref().and_then(|s| text.get(s.clone())).unwrap_or("");
    (line, words(&place, got_text, message).unwrap_or_else(|| message.to_string()))
}

/// Where an offset falls: the table (`vip[0].tls`, "" for the top level), whether the
/// offset is on that table's header, and the key whose value holds the offset.
#[derive(Debug, Default, PartialEq)]
struct Place {
    section: String,
    /// The header as written (`[[vip]]`), when the offset is on it.
    header: Option<String>,
    key: Option<String>,
}

/// Walks the lines before `at`: headers (`[a.b]`, `[[a]]`, numbering each array of
/// tables within its parent) and `key =` lines, skipping the inside of multi-line arrays.
fn locate(text: &str, at: usize) -> Place {
    let mut arrays: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut place = Place::default();
    let mut depth = 0i32;
    let mut offset = 0;
    for raw_line in text.split_inclusive('\n') {
        let start = offset;
        offset += raw_line.len();
        if start > at {
            break;
        }
        let line = raw_line.trim();
        if depth > 0 {
            depth += bracket_balance(line);
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let array = rest.starts_with('[');
            let inner = rest.trim_start_matches('[');
            let name = inner.split(']').next().unwrap_or("").trim();
            let parts: Vec<&str> = name.split('.').map(|p| p.trim().trim_matches('"').trim_matches('\'')).collect();
            let mut path = String::new();
            for (i, p) in parts.iter().enumerate() {
                let full = if path.is_empty() { p.to_string() } else { format!("{path}.{p}") };
                let last = i + 1 == parts.len();
                if last && array {
                    let n = arrays.entry(full.clone()).or_insert(0);
                    *n += 1;
                    path = format!("{full}[{}]", *n - 1);
                } else if let Some(n) = arrays.get(&full) {
                    path = format!("{full}[{}]", n.saturating_sub(1));
                } else {
                    path = full;
                }
            }
            place = Place { section: path, header: (at < offset).then(|| header_text(line)), key: None };
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let key = k.trim().trim_matches('"').trim_matches('\'');
            if !key.is_empty() && !key.contains(' ') {
                place.key = Some(key.to_string());
                place.header = None;
                depth = bracket_balance(v).max(0);
            }
        }
    }
    place
}

/// `[[vip]]` from a header line with a comment or spaces.
fn header_text(line: &str) -> String {
    let close = if line.starts_with("[[") { "]]" } else { "]" };
    match line.find(close) {
        Some(end) => line[..end + close.len()].to_string(),
        None => line.to_string(),
    }
}

/// Opening minus closing brackets outside strings and comments.
fn bracket_balance(s: &str) -> i32 {
    let mut n = 0;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in s.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q == '"' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '#' => break,
                '[' | '{' => n += 1,
                ']' | '}' => n -= 1,
                _ => {}
            },
        }
    }
    n
}

/// The message in words, or `None` to keep the parser's (a syntax error).
fn words(place: &Place, got_text: &str, message: &str) -> Option<String> {
    let field = |key: &str| if place.section.is_empty() { key.to_string() } else { format!("{}.{key}", place.section) };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (name, rest) = rest.split_once('`')?;
        // On a header (`[[vips]]`, `[vip.tlss]`): the unknown name is that table's, a
        // field of the table above it.
        let parent;
        let place = if place.header.is_some() {
            let trimmed =
                place.section.strip_suffix(']').and_then(|s| s.rsplit_once('[')).map_or(&*place.section, |(s, _)| s);
            parent = Place {
                section: trimmed.rsplit_once('.').map_or("", |(p, _)| p).to_string(),
                header: place.header.clone(),
                key: None,
            };
            &parent
        } else {
            place
        };
        let field =
            |key: &str| if place.section.is_empty() { key.to_string() } else { format!("{}.{key}", place.section) };
        let known = known_fields(rest);
        let top = place.section.is_empty();
        let what = if top { "unknown section" } else { "unknown field" };
        let section_words = section_words(&place.section);
        let mut out = if top {
            match &place.header {
                Some(h) => format!("{h}: {what}"),
                None => format!("{name}: a key outside any section"),
            }
        } else {
            format!("{}: {what}", field(name))
        };
        match suggest(name, &known) {
            Some(s) if top => out.push_str(&format!("; did you mean [{}{s}{}]?", brackets(place).0, brackets(place).1)),
            Some(s) => out.push_str(&format!("; did you mean `{s}`?")),
            None if known.is_empty() => {}
            None if top => out.push_str(&format!(" (the sections are {})", known.join(", "))),
            None => out.push_str(&format!(" (the fields of {section_words} are {})", known.join(", "))),
        }
        return Some(out);
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next()?;
        if place.section.is_empty() {
            return Some(format!("the [{name}] section is missing (it is required)"));
        }
        return Some(format!("{}: required, and missing from this {}", field(name), section_words(&place.section)));
    }
    if message.starts_with("duplicate key `") {
        return Some(match (&place.key, &place.header) {
            (_, Some(h)) => format!("{h}: this section is written twice: merge the two"),
            (Some(k), None) => format!("{}: set twice in this {}: keep one", field(k), section_words(&place.section)),
            (None, None) => message.to_string(),
        });
    }
    let Some(rest) = message.strip_prefix("invalid type: ").or_else(|| message.strip_prefix("invalid value: ")) else {
        let where_ = match (&place.key, place.section.is_empty()) {
            (Some(k), _) => format!("{}: ", field(k)),
            (None, false) => format!("{}: ", place.section),
            (None, true) => String::new(),
        };
        return Some(format!("{where_}{message}"));
    };
    let (got, expected) = rest.rsplit_once(", expected ")?;
    let key = place.key.clone().unwrap_or_default();
    let want = expected_words(expected, &key);
    let got_words = got_words(got, got_text);
    let hint = hint(expected, got, got_text, &key);
    let name = if key.is_empty() { place.section.clone() } else { field(&key) };
    Some(format!("{name}: expected {want}, got {got_words}{hint}"))
}

/// The brackets a top-level header was written with.
fn brackets(place: &Place) -> (&'static str, &'static str) {
    match &place.header {
        Some(h) if h.starts_with("[[") => ("[", "]"),
        _ => ("", ""),
    }
}

/// `vip[0].tls.certificate[1]` -> `[[vip.tls.certificate]]`: the table as the README
/// writes it.
fn section_words(section: &str) -> String {
    let array = section.ends_with(']');
    let mut name = String::new();
    let mut skip = false;
    for c in section.chars() {
        match c {
            '[' => skip = true,
            ']' => skip = false,
            c if !skip => name.push(c),
            _ => {}
        }
    }
    if array {
        format!("[[{name}]]")
    } else {
        format!("[{name}]")
    }
}

/// The names in serde's "expected one of `a`, `b`" or "expected `a` or `b`".
fn known_fields(rest: &str) -> Vec<String> {
    rest.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The known name closest to `name`: edit distance at most 2 (1 for short names), or
/// one is the start of the other.
fn suggest(name: &str, known: &[String]) -> Option<String> {
    let lower = name.to_ascii_lowercase().replace('-', "_");
    let max = if name.len() <= 4 { 1 } else { 2 };
    let best = known
        .iter()
        .map(|k| (levenshtein(&lower, k), k))
        .filter(|(d, _)| *d <= max)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.clone());
    best.or_else(|| {
        known
            .iter()
            .find(|k| lower.len() >= 3 && (k.starts_with(lower.as_str()) || lower.starts_with(k.as_str())))
            .cloned()
    })
}

pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb { prev } else { 1 + prev.min(row[j]).min(cur) };
            prev = cur;
        }
    }
    row[b.len()]
}

fn is_port(key: &str) -> bool {
    key == "port" || key.ends_with("_port")
}

fn is_duration(key: &str) -> bool {
    ["timeout", "_time", "interval", "slow_start", "ttl", "wait", "second_chance", "refresh"]
        .iter()
        .any(|w| key.contains(w))
}

/// serde's expected type in the README's words.
fn expected_words(expected: &str, key: &str) -> String {
    match expected {
        "u16" if is_port(key) => "a port number 1-65535".into(),
        "u16" => "a whole number 0-65535".into(),
        "u32" => "a whole number 0-4294967295".into(),
        "u64" | "usize" => "a whole number 0 or more".into(),
        "i64" | "i32" => "a whole number".into(),
        "f64" | "f32" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a string" if is_duration(key) => "a duration in quotes (such as \"30s\")".into(),
        "a string" => "text in quotes".into(),
        "a sequence" => "a list [..]".into(),
        e if e.starts_with("struct ") || e == "a map" => "a table (a [section] or { key = value })".into(),
        e => e.to_string(),
    }
}

/// serde's "unexpected" part (`string "80"`, `integer `70000``) in words.
fn got_words(got: &str, text: &str) -> String {
    let tick = |s: &str| s.split('`').nth(1).unwrap_or(s).to_string();
    if let Some(s) = got.strip_prefix("string ") {
        format!("the text {s}")
    } else if got.starts_with("integer ") || got.starts_with("floating point ") || got.starts_with("boolean ") {
        tick(got)
    } else if got == "sequence" {
        "a list".into()
    } else if got == "map" {
        match text.lines().count() {
            1 if !text.starts_with('{') && text.len() <= 40 => format!("`{text}`"),
            _ => "a table".into(),
        }
    } else {
        got.to_string()
    }
}

/// The obvious fix, with a leading space and in parentheses, or nothing.
fn hint(expected: &str, got: &str, got_text: &str, key: &str) -> String {
    let number = matches!(expected, "u16" | "u32" | "u64" | "usize" | "i64" | "i32" | "f64");
    if let Some(s) = got.strip_prefix("string ") {
        let inner = s.trim_matches('"');
        if number && inner.trim().parse::<f64>().is_ok() {
            return format!(" (write {} without quotes)", inner.trim());
        }
        if expected == "a boolean" {
            return match inner.to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "1" => " (write true without quotes)".into(),
                "false" | "no" | "off" | "0" => " (write false without quotes)".into(),
                _ => " (write true or false without quotes)".into(),
            };
        }
        if expected == "a sequence" {
            return format!(" (write [{s}])");
        }
        return String::new();
    }
    if expected == "a string"
        && (got.starts_with("integer") || got.starts_with("floating") || got.starts_with("boolean"))
    {
        if is_duration(key) {
            return format!(" (write \"{got_text}s\" for seconds)");
        }
        return format!(" (write \"{got_text}\" in quotes)");
    }
    if number && got.starts_with("integer") {
        if is_port(key) && expected == "u16" {
            return String::new();
        }
        if got_text.starts_with('-') {
            return " (no negative numbers)".into();
        }
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places() {
        let text = "[dispatcher]\ninterface = \"eth0\"\n[[vip]]\nname = \"a\"\n[[vip]]\nname = \"b\"\nlist = [\n \"x\",\n 3]\n[vip.tls]\n[[vip.tls.certificate]]\ncert = 4\n";
        let at = |needle: &str| locate(text, text.find(needle).unwrap());
        assert_eq!(at("eth0").section, "dispatcher");
        assert_eq!(at("eth0").key.as_deref(), Some("interface"));
        assert_eq!(at("\"b\"").section, "vip[1]");
        assert_eq!(at(" 3]").key.as_deref(), Some("list"), "inside a multi-line array");
        assert_eq!(at("4\n").section, "vip[1].tls.certificate[0]");
        assert_eq!(at("[[vip.tls").header.as_deref(), Some("[[vip.tls.certificate]]"));
        assert_eq!(section_words("vip[1].tls.certificate[0]"), "[[vip.tls.certificate]]");
        assert_eq!(section_words("http"), "[http]");
    }

    #[test]
    fn suggestions() {
        let known: Vec<String> = ["name", "address", "weight", "port", "max_connections"].map(String::from).to_vec();
        assert_eq!(suggest("wieght", &known).as_deref(), Some("weight"));
        assert_eq!(suggest("adress", &known).as_deref(), Some("address"));
        assert_eq!(suggest("max_conn", &known).as_deref(), Some("max_connections"));
        assert_eq!(suggest("Port", &known).as_deref(), Some("port"));
        assert_eq!(suggest("no_such_field", &known), None);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
    }
}
