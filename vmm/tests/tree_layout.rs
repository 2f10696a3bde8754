//! The tree as the README describes it: no module of the kvmscope library
//! imports one above it, and the code map names every module there is.
//!
//! Read from the sources, so a new upward `use crate::...`, two files of a
//! module folder that import each other, a new module left out of the layers
//! below, or a module the README does not name fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The library's top-level modules, lowest layer first. A module may name
/// (`crate::x`) only modules of lower layers; test code may name anything.
const LAYERS: &[&[&str]] = &[
    // Leaves: quantities, CPU structures, exit dispatch, kicks, host facts,
    // the run state, fds over sockets.
    &[
        "units", "x86_64", "exits", "kick", "backend", "runstate", "scm",
    ],
    // Guest RAM; workload specs; the wire format.
    &["memory", "workload", "protocol"],
    // Boot images and dirty tracking, on guest RAM; the clients, which speak
    // only the wire format.
    &["boot", "dirty", "client"],
    // A vCPU: it reports through a callback, knowing nothing of the main loop.
    &["vcpu"],
    // The main loop's messages; what is read from vCPUs.
    &["messages", "summary", "sampler"],
    // The VM; what serves or draws the sampler's series.
    &["vm", "signals", "metrics", "plot"],
    // What works on a running VM.
    &["readiness", "migration"],
    // Who serves a VMM: the control server, the fuzz entry points.
    &["control", "fuzz"],
    // Top: `kvmscope run` and the host-wide exporter.
    &["run", "exporter"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The library's top-level modules, from the tree (`x.rs` or `x/`).
fn modules() -> BTreeSet<String> {
    fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            let module = if p.is_dir() {
                name
            } else {
                name.strip_suffix(".rs")?.to_string()
            };
            let skip = ["lib", "main"].contains(&module.as_str()) || module.ends_with("_tests");
            (!skip).then_some(module)
        })
        .collect()
}

/// Every `.rs` file of a module, with the test code cut off.
fn module_code(module: &str) -> Vec<(PathBuf, String)> {
    let root = src();
    let mut files = vec![root.join(format!("{module}.rs"))];
    let mut dirs = vec![root.join(module)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files
        .into_iter()
        .filter(|p| p.exists() && !p.to_string_lossy().ends_with("_tests.rs"))
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap();
            // Unit tests sit at the bottom of their module (README, "Tests").
            let code = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => text[..at].to_string(),
                None => text,
            };
            (p, code)
        })
        .collect()
}

/// The top-level modules a file's code names as `crate::x` or within
/// `crate::{x, y::z}` (over several lines too), with their line; comments
/// left out.
fn named_modules(code: &str, modules: &BTreeSet<String>) -> Vec<(usize, String)> {
    named_after(code, "crate::", modules)
}

/// As [`named_modules`], for any path prefix (`super::`, `crate::control::`).
fn named_after(code: &str, prefix: &str, modules: &BTreeSet<String>) -> Vec<(usize, String)> {
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = Vec::new();
    let mut push = |at: usize, name: String| {
        if modules.contains(&name) {
            found.push((code[..at].matches('\n').count() + 1, name));
        }
    };
    for (at, _) in code.match_indices(prefix) {
        // `crate::` inside `foo_crate::` or `super::` inside `a::super::` is not a path start.
        if code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            push(at, ident(rest));
            continue;
        };
        // Split the group's top-level items at commas outside inner braces.
        let (mut depth, mut item_start) = (0usize, 0usize);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    push(at, ident(&group[item_start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    push(at, ident(&group[item_start..i]));
                    item_start = i + 1;
                }
                _ => {}
            }
        }
    }
    found
}

#[test]
fn every_module_has_a_layer() {
    let unplaced: Vec<_> = modules()
        .into_iter()
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules missing from LAYERS in {}: {unplaced:?}",
        file!()
    );
    let gone: Vec<_> = LAYERS
        .iter()
        .flat_map(|l| l.iter())
        .filter(|m| !modules().contains(**m))
        .collect();
    assert!(
        gone.is_empty(),
        "LAYERS names modules that do not exist: {gone:?}"
    );
}

#[test]
fn no_module_imports_one_above_it() {
    let modules = modules();
    let mut upward = Vec::new();
    for module in &modules {
        let Some(own) = layer_of(module) else {
            continue;
        };
        for (path, code) in module_code(module) {
            for (line, named) in named_modules(&code, &modules) {
                if named == *module {
                    continue;
                }
                let theirs = layer_of(&named).unwrap_or(usize::MAX);
                if theirs >= own {
                    upward.push(format!(
                        "{}:{line}: {module} (layer {own}) names {named} (layer {theirs})",
                        path.strip_prefix(src()).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that go up or sideways:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_import() {
    // The parser itself: a `use` of a higher module is found, a comment is not.
    let modules: BTreeSet<String> = ["vm", "vcpu", "run", "units"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let code = "use crate::vm::Vm;\n// crate::vcpu in a comment\nlet x = crate::lock(&m);\n\
                use crate::{\n    run::{self, X},\n    units,\n};\n";
    assert_eq!(
        named_modules(code, &modules),
        vec![
            (1, "vm".to_string()),
            (4, "run".to_string()),
            (4, "units".to_string())
        ]
    );
}

#[test]
fn no_two_files_of_a_module_import_each_other() {
    // Within a module folder, sibling files (`super::x`, `crate::m::x`) form
    // no cycle: each has a place in an order of its own.
    let mut cycles = Vec::new();
    for module in modules().into_iter().filter(|m| src().join(m).is_dir()) {
        let dir = src().join(&module);
        let files: BTreeSet<String> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().to_string_lossy().to_string();
                let stem = name.strip_suffix(".rs")?.to_string();
                (stem != "mod" && !stem.ends_with("_tests")).then_some(stem)
            })
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in &files {
            let text = fs::read_to_string(dir.join(format!("{file}.rs"))).unwrap();
            let code = text
                .find("#[cfg(test)]\nmod tests")
                .map_or(text.as_str(), |at| &text[..at]);
            let own = format!("crate::{module}::");
            for (_, named) in named_after(code, "super::", &files)
                .into_iter()
                .chain(named_after(code, &own, &files))
            {
                if named != *file {
                    edges.entry(file.clone()).or_default().insert(named);
                }
            }
        }
        cycles.extend(find_cycle(&edges).map(|c| format!("{module}/: {}", c.join(" -> "))));
    }
    assert!(
        cycles.is_empty(),
        "files that import each other:\n{}",
        cycles.join("\n")
    );
}

/// One cycle of `edges`, if there is one, as the names along it.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            let mut cycle = path[i..].to_vec();
            cycle.push(at.to_string());
            return Some(cycle);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_string());
        for next in edges.get(at).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(at.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|k| visit(k, edges, &mut Vec::new(), &mut done))
}

#[test]
fn a_cycle_between_two_files_is_found() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&edges), None);
    edges.entry("c".into()).or_default().insert("b".into());
    assert_eq!(
        find_cycle(&edges),
        Some(vec!["b".to_string(), "c".to_string(), "b".to_string()])
    );
}

/// The README's "Code map" table, as text.
fn code_map() -> String {
    let readme =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let start = readme.find("## Code map").expect("README has a Code map");
    let rest = &readme[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_string()
}

/// `stats/src/{a,b}.rs` written out as `stats/src/a.rs`, `stats/src/b.rs`.
fn expand_braces(text: &str) -> String {
    let mut out = text.to_string();
    while let (Some(open), Some(close)) = (out.find('{'), out.find('}')) {
        if close < open {
            break;
        }
        let head_start = out[..open].rfind(['`', ' ']).map_or(0, |i| i + 1);
        let tail_end = out[close..]
            .find(['`', ' '])
            .map_or(out.len(), |i| close + i);
        let (head, tail) = (&out[head_start..open], &out[close + 1..tail_end]);
        let expanded: Vec<String> = out[open + 1..close]
            .split(',')
            .map(|part| format!("{head}{part}{tail}"))
            .collect();
        out = format!(
            "{}{}{}",
            &out[..head_start],
            expanded.join("` `"),
            &out[tail_end..]
        );
    }
    out
}

#[test]
fn the_readme_code_map_names_every_module_and_stats_file() {
    let map = expand_braces(&code_map());
    let mut missing = Vec::new();
    for module in modules() {
        let dir = format!("vmm/src/{module}/");
        let file = [format!("vmm/src/{module}.rs"), format!("`{module}.rs`")];
        let named = if src().join(&module).is_dir() {
            map.contains(&dir)
        } else {
            file.iter().any(|f| map.contains(f.as_str()))
        };
        if !named {
            missing.push(module);
        }
    }
    let stats = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stats/src");
    for e in fs::read_dir(stats).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        if name == "lib.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        if !map.contains(&format!("stats/src/{name}")) {
            missing.push(format!("stats/src/{name}"));
        }
    }
    assert!(
        missing.is_empty(),
        "the README's code map does not name: {missing:?}"
    );
}

#[test]
fn integration_tests_are_named_area_topic() {
    // README, "Tests": files in `<crate>/tests/` are `<area>_<topic>.rs`.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    for dir in [root.join("tests"), root.join("../stats/tests")] {
        for e in fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let Some(stem) = path
                .extension()
                .is_some_and(|x| x == "rs")
                .then(|| path.file_stem().unwrap().to_string_lossy().to_string())
            else {
                continue;
            };
            let parts: Vec<&str> = stem.splitn(2, '_').collect();
            if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
                bad.push(path.display().to_string());
            }
        }
    }
    assert!(bad.is_empty(), "not named <area>_<topic>.rs: {bad:?}");
}

#[test]
fn braces_in_the_code_map_expand() {
    assert_eq!(
        expand_braces("`stats/src/{header,schema}.rs`"),
        "`stats/src/header.rs` `stats/src/schema.rs`"
    );
}
