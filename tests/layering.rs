//! The layering, read from the sources of every crate: which layer (a
//! top-level module, or the allocator and lab crates) refers to which
//! (`crate::NAME` outside comments), with no cycle among them, and the allocator (`memory`) referring to no
//! layer above it. A new reference that closes a cycle fails here with the
//! files that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// layer → layer it refers to → files that do. The layers: this crate's
/// top-level modules (cli, lessons), the engine crate's (device, tensor,
/// ops, …), and the allocator, lab and parallel crates as `memory`, `lab`
/// and `parallel` (the
/// names every crate above them knows them by).
fn graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<(String, std::path::PathBuf)> = Vec::new();
    for (krate, parts, path) in modules() {
        let layer = match krate {
            "crates/lab/src" => "lab".to_string(),
            "crates/alloc/src" => "memory".to_string(),
            "crates/parallel/src" => "parallel".to_string(),
            _ if parts == ["lib"] || parts == ["main"] => continue,
            _ => parts[0].clone(),
        };
        files.push((layer, path));
    }
    let layers: BTreeSet<String> = files.iter().map(|(l, _)| l.clone()).collect();
    let mut g = Graph::new();
    for (layer, path) in &files {
        let text = strip_comments(&std::fs::read_to_string(path).unwrap());
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if layers.contains(&name) && name != *layer {
                g.entry(layer.clone())
                    .or_default()
                    .entry(name)
                    .or_default()
                    .insert(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
        g.entry(layer.clone()).or_default();
    }
    g
}

/// A cycle through `g`, as the modules in order, if there is one.
fn cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut c = path[at..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in g.get(m).into_iter().flat_map(|e| e.keys()) {
            if let Some(c) = visit(g, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|m| visit(g, m, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_refers_back_to_a_module_that_refers_to_it() {
    let g = graph();
    assert!(g.len() > 10, "read {} modules", g.len());
    if let Some(c) = cycle(&g) {
        let why: Vec<String> = c
            .windows(2)
            .map(|w| format!("{} → {}: {:?}", w[0], w[1], g[&w[0]][&w[1]]))
            .collect();
        panic!("import cycle {}\n{}", c.join(" → "), why.join("\n"));
    }
}

#[test]
fn the_allocator_refers_to_no_layer_above_it() {
    // (That it names no wgpu, nor does the lab, is tests/layout.rs's.)
    let g = graph();
    let memory = &g["memory"];
    assert!(memory.is_empty(), "memory refers to {memory:?}");
}

#[test]
fn a_cycle_is_found_where_there_is_one() {
    // The checker itself: a three-module loop and a clean chain.
    let edge = |a: &str, b: &str| (a.to_string(), b.to_string());
    let build = |edges: &[(String, String)]| {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.clone())
                .or_default()
                .entry(b.clone())
                .or_default();
            g.entry(b.clone()).or_default();
        }
        g
    };
    let looped = build(&[edge("a", "b"), edge("b", "c"), edge("c", "a")]);
    assert_eq!(cycle(&looped).unwrap(), ["a", "b", "c", "a"]);
    let chain = build(&[edge("a", "b"), edge("b", "c"), edge("a", "c")]);
    assert_eq!(cycle(&chain), None);
}

/// Every source file of every crate with its module path (`["ops",
/// "matmul"]`): `a/b.rs` and `a/b/mod.rs` are `a::b`; a crate's root is
/// `["lib"]` or `["main"]`.
fn modules() -> Vec<(&'static str, Vec<String>, std::path::PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in [
        "src",
        "crates/engine/src",
        "crates/lab/src",
        "crates/alloc/src",
        "crates/parallel/src",
    ] {
        let src = root.join(dir);
        let mut stack = vec![src.clone()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let rel = path.strip_prefix(&src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if parts.last().is_some_and(|p| p == "mod") {
                    parts.pop();
                }
                out.push((dir, parts, path));
            }
        }
    }
    out
}

/// Within each crate, sibling modules (children of one parent) → the
/// siblings they refer to (`super::x` or `crate::…::x`, outside comments).
/// A reference between a module and its own ancestor is not an edge.
fn sibling_graph() -> Graph {
    // A crate's root declares its modules; it is no sibling of theirs.
    let mods: Vec<_> = modules()
        .into_iter()
        .filter(|(_, m, _)| m != &["lib"] && m != &["main"])
        .collect();
    let known: BTreeSet<(String, Vec<String>)> = mods
        .iter()
        .map(|(c, m, _)| (c.to_string(), m.clone()))
        .collect();
    let mut g = Graph::new();
    for (krate, m, path) in &mods {
        let text = strip_comments(&std::fs::read_to_string(path).unwrap());
        let is_mod_rs = path.file_name().is_some_and(|f| f == "mod.rs");
        let name = |p: &[String]| format!("{krate}:{}", p.join("::"));
        g.entry(name(m)).or_default();
        for start in ["super::", "crate::"] {
            for (i, _) in text.match_indices(start) {
                if i > 0 && text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let rest: Vec<String> = text[i + start.len()..]
                    .split("::")
                    .map(|s| {
                        s.chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect::<String>()
                    })
                    .take_while(|s| !s.is_empty())
                    .collect();
                let mut full: Vec<String> = if start == "super::" {
                    // `super` of a file module is its parent; of a mod.rs,
                    // the parent's parent.
                    let up = if is_mod_rs { 2 } else { 1 };
                    m[..m.len().saturating_sub(up)].to_vec()
                } else {
                    Vec::new()
                };
                full.extend(rest);
                let Some(target) = (1..=full.len())
                    .rev()
                    .map(|k| full[..k].to_vec())
                    .find(|p| known.contains(&(krate.to_string(), p.clone())))
                else {
                    continue;
                };
                let common = m.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common >= m.len() || common >= target.len() {
                    continue;
                }
                let (from, to) = (&m[..=common], &target[..=common]);
                g.entry(name(from))
                    .or_default()
                    .entry(name(to))
                    .or_default()
                    .insert(path.display().to_string());
            }
        }
    }
    g
}

#[test]
fn no_module_of_any_crate_is_in_an_import_cycle_with_its_siblings() {
    let g = sibling_graph();
    assert!(g.len() > 100, "read {} modules", g.len());
    assert!(
        g.get("crates/engine/src:nn::zoo")
            .is_some_and(|e| e.contains_key("crates/engine/src:nn::mlp")),
        "the reader sees zoo.rs naming mlp.rs"
    );
    if let Some(c) = cycle(&g) {
        let why: Vec<String> = c
            .windows(2)
            .map(|w| format!("{} → {}: {:?}", w[0], w[1], g[&w[0]][&w[1]]))
            .collect();
        panic!("import cycle {}\n{}", c.join(" → "), why.join("\n"));
    }
}
