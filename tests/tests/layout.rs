//! The module graph stays readable bottom-up: no cycle between the top-level modules of
//! the agent (`dispatcher/src`) or of the XDP program (`dispatcher-ebpf/src`), read from
//! their `crate::` paths (tests left out). A change that makes one fails here, naming it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// Top-level module -> the top-level modules it names through `crate::`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        // Unit tests may reach anywhere.
        let text = text.split("#[cfg(test)]").next().unwrap();
        let deps = g.entry(top.clone()).or_default();
        // `crate::a::...`, and `use crate::{a::..., b, ...}` (the names right after a `{`
        // or `,` that open a path).
        let mut rest = text;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + 7..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find("};").unwrap_or(group.len());
                let mut depth = 0;
                let mut start = 0;
                let inner = &group[..end];
                for (j, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            deps.insert(first_segment(&inner[start..j]));
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                deps.insert(first_segment(&inner[start..]));
            } else {
                deps.insert(first_segment(rest));
            }
        }
        deps.remove(&top);
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for deps in g.values_mut() {
        deps.retain(|d| names.contains(d));
    }
    g
}

fn first_segment(path: &str) -> String {
    path.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in &t.g[v] {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t =
        T { g, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn assert_acyclic(crate_src: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(crate_src);
    let g = graph(&src);
    assert!(g.len() > 5, "{crate_src}: only {} modules found", g.len());
    let c = cycles(&g);
    let edges: Vec<String> = g.iter().map(|(k, v)| format!("{k} -> {v:?}")).collect();
    assert!(c.is_empty(), "{crate_src}: modules in a cycle: {c:?}\n{}", edges.join("\n"));
}

#[test]
fn the_agents_top_level_modules_form_no_cycle() {
    assert_acyclic("dispatcher/src");
}

#[test]
fn the_xdp_programs_modules_form_no_cycle() {
    assert_acyclic("dispatcher-ebpf/src");
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        g.entry(a.into()).or_default().insert(b.into());
        g.entry(b.into()).or_default();
    }
    assert_eq!(cycles(&g), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
}
