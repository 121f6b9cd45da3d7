//! The documentation: every relative link of the README and of docs/ resolves (the file
//! exists; an `#anchor` is a heading of the page it names, as GitHub makes its anchors),
//! the README stays short and lists every page, every metric the agent writes is on the
//! operations page, and every benchmark has its block on the benchmarks page.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// The README's length limit: what it is, install, a minimal configuration, first
/// operations, links; the rest is in docs/.
const README_MAX_LINES: usize = 300;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// README.md and docs/*.md.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of a Markdown page outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` without its inline code spans (`` `...` ``).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, only letters, digits, `-`, `_` and spaces
/// kept, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings; a repeated heading gets `-1`, `-2`... as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.insert(anchor);
    }
    out
}

/// The link targets of a page's prose: `[text](target)`, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// What is wrong with the relative links of `pages`: a file that does not exist, an
/// anchor that is no heading of its page.
fn broken_links(pages: &[PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            let at = format!("{}:{line}: ({target})", page.display());
            if !path.exists() {
                broken.push(format!("{at}: no file {}", path.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!("{at}: no heading #{anchor} in {}", path.display()));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_resolves() {
    let root = workspace();
    let pages = pages(&root);
    let count: usize = pages.iter().map(|p| links(&std::fs::read_to_string(p).unwrap()).len()).sum();
    assert!(count > 50, "only {count} links found: the link reader is broken");
    let broken = broken_links(&pages);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The check fails on what it is there for: a missing file, a missing anchor, in another
/// page or in the same one. Links in code are not links.
#[test]
fn a_broken_link_is_found() {
    let dir = std::env::temp_dir().join(format!("dispatcher-docs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    let readme = dir.join("README.md");
    std::fs::write(
        &readme,
        "# Title\n\n[ok](docs/a.md#the-a-page-a) [ok](#title) [ok](docs/a.md)\n\
         [gone](docs/missing.md) [no anchor](docs/a.md#nowhere) [self](#not-here)\n\
         `[code](docs/missing.md)`\n```\n[fenced](docs/missing.md)\n# Fenced heading\n```\n[fenced heading](#fenced-heading)\n",
    )
    .unwrap();
    std::fs::write(dir.join("docs/a.md"), "# The A page (`a`)\n\n[back](../README.md#title)\n").unwrap();
    let mut broken = broken_links(&[readme, dir.join("docs/a.md")]);
    let _ = std::fs::remove_dir_all(&dir);
    broken.iter_mut().for_each(|b| *b = b.split(": (").nth(1).unwrap_or(b).to_string());
    assert_eq!(
        broken.iter().map(|b| b.split(')').next().unwrap()).collect::<Vec<_>>(),
        ["docs/missing.md", "docs/a.md#nowhere", "#not-here", "#fenced-heading"],
        "{broken:#?}"
    );
}

#[test]
fn github_anchors() {
    assert_eq!(slug("Several dispatchers (`shared/`, `[cluster]`)"), "several-dispatchers-shared-cluster");
    assert_eq!(
        slug("Behind a router: BGP, ECMP and connection steering"),
        "behind-a-router-bgp-ecmp-and-connection-steering"
    );
    assert_eq!(slug("`plugin_config`"), "plugin_config");
    assert_eq!(slug("A worked 3-dispatcher example"), "a-worked-3-dispatcher-example");
    let a = anchors("# A\n## A\n```\n# B\n```\n#not a heading\n### C. d\n");
    assert_eq!(a.into_iter().collect::<Vec<_>>(), ["a", "a-1", "c-d"]);
}

#[test]
fn the_readme_is_short_and_lists_every_page() {
    let root = workspace();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines < README_MAX_LINES, "README.md has {lines} lines: move the detail into docs/");
    let section = &readme[readme.find("\n## Documentation").expect("a Documentation section")..];
    let listed: BTreeSet<String> = links(section).into_iter().map(|(_, t)| t).collect();
    for page in pages(&root).iter().skip(1) {
        let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        assert!(listed.contains(&name), "the README's Documentation list lacks {name}");
    }
}

/// The metric families the agent writes: the `"dispatcher_..."` names in its source.
fn metric_families(dir: &Path, out: &mut BTreeSet<String>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            metric_families(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for (at, _) in text.match_indices("\"dispatcher_") {
                let rest = &text[at + 1..];
                let Some(end) = rest.find('"') else { continue };
                let name = &rest[..end];
                let name_like = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if name_like && !name.ends_with('_') {
                    out.insert(name.to_string());
                }
            }
        }
    }
}

#[test]
fn the_operations_page_names_every_metric() {
    let root = workspace();
    let mut families = BTreeSet::new();
    metric_families(&root.join("dispatcher/src"), &mut families);
    assert!(families.len() > 80, "only {} metric names found in dispatcher/src", families.len());
    let page = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let missing: Vec<&String> = families.iter().filter(|f| !page.contains(&format!("`{f}"))).collect();
    assert!(missing.is_empty(), "docs/operations.md does not name: {missing:?}");
}

/// `cargo xtask bench-docs` writes each benchmark's section of the report into its block
/// of docs/benchmarks.md: every benchmark of the bench program's registry has one.
#[test]
fn every_benchmark_has_its_block() {
    let root = workspace();
    let registry = std::fs::read_to_string(root.join("tools/src/bin/bench/main.rs")).unwrap();
    let page = std::fs::read_to_string(root.join("docs/benchmarks.md")).unwrap();
    let titles: Vec<&str> =
        registry.lines().filter_map(|l| l.trim().strip_prefix("title: \"")?.strip_suffix("\",")).collect();
    assert!(titles.len() >= 13, "{titles:?}");
    for title in titles {
        let start = format!("<!-- bench:start {title} -->");
        let at = page.find(&start).unwrap_or_else(|| panic!("docs/benchmarks.md has no block `{start}`"));
        assert!(page[at..].contains("<!-- bench:end -->"), "{start} is not closed");
    }
}
