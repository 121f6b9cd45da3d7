//! The manual pages (man/dispatcher.8, man/dispatcher.toml.5) are written, not generated:
//! these tests hold them to what they describe. Every option and argument of every
//! command is in dispatcher(8), in that command's entry, and nothing a command does not
//! take; every table of dispatcher.toml(5) lists exactly the fields the configuration
//! parser accepts, and its example passes `dispatcher check`; groff has nothing to say
//! about either page; the pages and the units refer only to pages that exist.

use std::{collections::BTreeSet, path::PathBuf, process::Command};

use dispatcher_testbed::netns::dispatcher_bin;

fn workspace() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn page(name: &str) -> String {
    std::fs::read_to_string(workspace().join("man").join(name)).unwrap_or_else(|e| panic!("man/{name}: {e}"))
}

/// `dispatcher ARGS`: (exit code, stdout, stderr).
fn dispatcher(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(dispatcher_bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Roff source as the reader sees its words: the escapes and font changes these pages
/// use, removed (macro names stay at the start of their lines).
fn unroff(s: &str) -> String {
    let mut t = s.to_string();
    for (from, to) in [
        ("\\-", "-"),
        ("\\(dq", "\""),
        ("\\(oq", "'"),
        ("\\(cq", "'"),
        ("\\&", ""),
        ("\\fB", ""),
        ("\\fI", ""),
        ("\\fR", ""),
        ("\\fP", ""),
    ] {
        t = t.replace(from, to);
    }
    t
}

/// The text of `.SH title` up to the next `.SH`.
fn sh<'a>(source: &'a str, title: &str) -> &'a str {
    let head = format!("\n.SH {title}\n");
    let start = source.find(&head).unwrap_or_else(|| panic!("no section {title}")) + head.len();
    let end = source[start..].find("\n.SH ").map_or(source.len(), |e| start + e);
    &source[start..end]
}

/// The `.SS` subsections of a section: (title, text).
fn subsections(section: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in section.lines() {
        if let Some(title) = line.strip_prefix(".SS ") {
            out.push((title.trim_matches('"').to_string(), String::new()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

/// The commands `dispatcher --help` lists (but `help`).
fn commands() -> Vec<String> {
    let (code, help, _) = dispatcher(&["--help"]);
    assert_eq!(code, 0);
    let list = help.split("Commands:\n").nth(1).expect("a command list");
    list.lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

/// What `dispatcher CMD --help` lists: its options (short letter, long name) but
/// --help, and its arguments' names.
fn usage(cmd: &str) -> (Vec<(Option<char>, String)>, Vec<String>) {
    let (code, help, err) = dispatcher(&[cmd, "--help"]);
    assert_eq!(code, 0, "{cmd} --help: {err}");
    let block = |title: &str| -> Vec<String> {
        help.split(&format!("\n{title}:\n"))
            .nth(1)
            .map(|b| b.lines().take_while(|l| l.starts_with(' ')).map(|l| l.trim().to_string()).collect())
            .unwrap_or_default()
    };
    let options = block("Options")
        .iter()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let (short, long) = match words.first()?.strip_suffix(',') {
                Some(s) => (s.strip_prefix('-')?.chars().next(), *words.get(1)?),
                None => (None, words[0]),
            };
            Some((short, long.strip_prefix("--")?.to_string()))
        })
        .filter(|(_, long)| long != "help")
        .collect();
    let arguments = block("Arguments")
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .map(|a| a.trim_matches(|c| "<>[].".contains(c)).to_string())
        .collect();
    (options, arguments)
}

/// Whether `text` has `word` on its own: not followed by a letter, digit or `-` and not
/// preceded by one (so `-c` is not found in `--config` or `dispatcher-c`).
fn mentions(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let free = |c: Option<char>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'));
        free(before) && free(after)
    })
}

/// The `--long` options a text names.
fn long_options(text: &str) -> BTreeSet<String> {
    text.match_indices("--")
        .filter(|(at, _)| !text[..*at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '-'))
        .map(|(at, _)| text[at + 2..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect())
        .filter(|o: &String| !o.is_empty())
        .collect()
}

#[test]
fn every_command_and_option_is_in_dispatcher_8_and_nothing_else() {
    let source = page("dispatcher.8");
    let text = unroff(&source);
    let sections = subsections(sh(&text, "COMMANDS"));
    // What the page describes in an item of its own (`.TP`, then the item's head).
    let heads = |section: &str| -> String {
        let lines: Vec<&str> = section.lines().collect();
        lines.windows(2).filter(|w| w[0] == ".TP").map(|w| format!("{}\n", w[1])).collect()
    };
    let general = heads(sh(&text, "OPTIONS"));
    let synopsis = sh(&text, "SYNOPSIS");
    let commands = commands();
    assert!(commands.len() >= 14, "{commands:?}");
    // Each entry is titled by the commands it describes, and they are real ones.
    let mut described = BTreeSet::new();
    for (title, _) in &sections {
        for name in title.split(", ") {
            assert!(commands.contains(&name.to_string()), "COMMANDS describes `{name}`, which is no command");
            described.insert(name.to_string());
        }
    }
    for cmd in &commands {
        assert!(described.contains(cmd), "`{cmd}` has no entry under COMMANDS");
        assert!(mentions(synopsis, cmd), "`{cmd}` is not in the SYNOPSIS");
        let (_, entry) = sections.iter().find(|(t, _)| t.split(", ").any(|n| n == cmd)).unwrap();
        let (options, arguments) = usage(cmd);
        for (short, long) in &options {
            let long_form = format!("--{long}");
            let here = mentions(entry, &long_form) || short.is_some_and(|c| mentions(entry, &format!("-{c}")));
            assert!(here, "`{cmd} {long_form}` is not in its entry under COMMANDS:\n{entry}");
            let described = mentions(&heads(entry), &long_form) || mentions(&general, &long_form);
            assert!(described, "`{cmd} {long_form}` has no item of its own (.TP) in its entry or under OPTIONS");
        }
        for a in &arguments {
            assert!(mentions(entry, a), "`{cmd}`'s argument {a} is not in its entry");
        }
    }
    // An entry names only options that its commands take.
    for (title, entry) in &sections {
        let takes: BTreeSet<String> = title.split(", ").flat_map(|c| usage(c).0).map(|(_, long)| long).collect();
        for o in long_options(entry) {
            assert!(takes.contains(&o), "the entry `{title}` names --{o}, which {title} does not take");
        }
        assert!(!mentions(entry, "-V"), "`{title}` does not take -V");
    }
    // -V where the page says it is: before a command, not after.
    let (code, version, _) = dispatcher(&["-V"]);
    assert!(code == 0 && version.starts_with("dispatcher "), "{version}");
    assert_eq!(dispatcher(&["run", "-V"]).0, 2);
    assert!(mentions(&text, "-V") && mentions(&text, "--version"));
}

/// The tables of dispatcher.toml(5): title (`backend`, `vip.tls`...), whether it is an
/// array of tables (`[[...]]`), and its fields (`.TP` then `.B field`).
fn documented_tables() -> Vec<(String, bool, Vec<String>)> {
    let source = page("dispatcher.toml.5");
    subsections(sh(&source, "\"TABLES AND FIELDS\""))
        .into_iter()
        .map(|(title, text)| {
            let array = title.starts_with("[[");
            let name = title.trim_matches(|c| c == '[' || c == ']').to_string();
            let lines: Vec<&str> = text.lines().collect();
            let fields = lines
                .windows(2)
                .filter(|w| w[0] == ".TP")
                .map(|w| {
                    let f = w[1].strip_prefix(".B ").unwrap_or_else(|| panic!("[{name}]: `.TP` then `{}`", w[1]));
                    f.split_whitespace().next().unwrap().to_string()
                })
                .collect();
            (name, array, fields)
        })
        .collect()
}

/// The fields the parser accepts in `table` (`""`: the top level), from the message
/// that refuses an unknown one.
fn accepted(table: &str, tables: &[(String, bool, Vec<String>)]) -> BTreeSet<String> {
    let mut text = String::new();
    if table.is_empty() {
        text.push_str("no_such_field = 1\n[dispatcher]\ninterface = \"eth0\"\n");
    } else {
        if table != "dispatcher" {
            text.push_str("[dispatcher]\ninterface = \"eth0\"\n");
        }
        let parts: Vec<&str> = table.split('.').collect();
        for i in 1..=parts.len() {
            let prefix = parts[..i].join(".");
            let (_, array, _) = tables.iter().find(|(n, ..)| *n == prefix).unwrap_or_else(|| panic!("no [{prefix}]"));
            text.push_str(&if *array { format!("[[{prefix}]]\n") } else { format!("[{prefix}]\n") });
        }
        text.push_str("no_such_field = 1\n");
    }
    let (code, _, err) = check_text(&text);
    assert_eq!(code, 1, "{text}");
    // "(the fields of [[vip]] are a, b)", "(the sections are a, b)".
    let line = err.lines().find(|l| l.contains("no_such_field")).unwrap_or_else(|| panic!("[{table}]: {err}"));
    let list = line.split(" are ").nth(1).unwrap_or_else(|| panic!("[{table}]: {err}"));
    let list = list.split(')').next().unwrap();
    list.split(',').map(|f| f.trim().to_string()).filter(|f| !f.is_empty()).collect()
}

static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `dispatcher check` on `text`: (exit code, stdout, stderr).
fn check_text(text: &str) -> (i32, String, String) {
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("dispatcher-man-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("d.toml");
    std::fs::write(&file, text).unwrap();
    let r = dispatcher(&["check", file.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

#[test]
fn dispatcher_toml_5_lists_every_field_of_every_table_and_only_those() {
    let tables = documented_tables();
    assert!(tables.len() >= 14, "{:?}", tables.iter().map(|t| &t.0).collect::<Vec<_>>());
    let top: BTreeSet<String> = tables.iter().filter(|(n, ..)| !n.contains('.')).map(|(n, ..)| n.clone()).collect();
    assert_eq!(top, accepted("", &tables), "the page's top-level tables against the parser's");
    for (name, _, fields) in &tables {
        let documented: BTreeSet<String> = fields.iter().cloned().collect();
        assert_eq!(documented.len(), fields.len(), "[{name}] lists a field twice");
        // A sub-table with a section of its own is listed in its parent as a field.
        let mut want = accepted(name, &tables);
        want.retain(|f| !tables.iter().any(|(n, ..)| *n == format!("{name}.{f}")) || documented.contains(f));
        assert_eq!(documented, want, "[{name}]: the page's fields against the parser's");
    }
}

#[test]
fn the_example_of_dispatcher_toml_5_checks_cleanly() {
    let source = page("dispatcher.toml.5");
    let example = sh(&source, "EXAMPLE");
    let start = example.find("\n.nf\n").expect("a .nf block") + 5;
    let end = start + example[start..].find("\n.fi\n").expect("its .fi");
    let toml = unroff(&example[start..end + 1]);
    let (code, out, err) = check_text(&toml);
    assert_eq!(code, 0, "{toml}\n{err}");
    assert!(out.contains(": ok ("), "{out}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn groff_has_nothing_to_say_about_the_pages() {
    for name in ["dispatcher.8", "dispatcher.toml.5"] {
        let path = workspace().join("man").join(name);
        // As in the brief, and as lintian runs it.
        for args in [&["--warnings", "-l"][..], &["--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z"][..]] {
            let out = Command::new("man").args(args).arg(&path).env("LC_ALL", "C.UTF-8").output().unwrap();
            assert!(out.status.success(), "man {args:?} {name}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.trim().is_empty(), "man {args:?} {name}:\n{err}");
        }
    }
}

#[test]
fn the_pages_and_units_refer_only_to_pages_that_exist() {
    let ours = [("dispatcher", "8"), ("dispatcher.toml", "5")];
    let mut refs = BTreeSet::new();
    for name in ["dispatcher.8", "dispatcher.toml.5"] {
        for line in page(name).lines() {
            // `.BR name (N)`, the form the pages give a reference.
            let Some(rest) = line.strip_prefix(".BR ") else { continue };
            let words: Vec<&str> = rest.split_whitespace().collect();
            if let [name, section, ..] = words[..] {
                if let Some(s) = section.strip_prefix('(').and_then(|s| s.split(')').next()) {
                    if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
                        refs.insert((unroff(name), s.to_string()));
                    }
                }
            }
        }
    }
    for unit in ["dispatcher@.service", "dispatcher-decap@.service"] {
        let text = std::fs::read_to_string(workspace().join("packaging/systemd").join(unit)).unwrap();
        let docs = text.lines().find_map(|l| l.strip_prefix("Documentation=")).expect("Documentation=");
        for d in docs.split_whitespace() {
            let (name, section) = d.strip_prefix("man:").and_then(|m| m.strip_suffix(')')?.split_once('(')).unwrap();
            assert!(ours.contains(&(name, section)), "{unit}: {d} is not a page the package ships");
        }
    }
    assert!(refs.contains(&("dispatcher.toml".into(), "5".into())), "{refs:?}");
    for (name, section) in &refs {
        if ours.contains(&(name.as_str(), section.as_str())) {
            continue;
        }
        let found = Command::new("man").args(["-w", section, name]).output().unwrap();
        assert!(found.status.success(), "{name}({section}) is referred to and is no page here");
    }
}
