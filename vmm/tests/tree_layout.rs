//! The tree as the README describes it: no module of the kvmscope library
//! imports one above it, no two files of a module folder (its `mod.rs`
//! included) import each other, the `kvm-stats` crate and the Python scripts
//! have no import circle, and the code map names every module there is.
//!
//! Read from the sources, so a new upward `use crate::...`, two files that
//! import each other, a new module left out of the README's layer table (the
//! one list of layers: this test reads it), or a module the README does not
//! name fails here. Each check has a self-test on made-up code that shows it
//! can fail.

mod tree_support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use tree_support::{
    expand_braces, find_cycle, folder_cycle, layer_of, layers_from, named_modules, python_imports,
    without_tests,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn readme() -> String {
    fs::read_to_string(root().join("README.md")).unwrap()
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
            // `bin/` is the binary's: it may use any module, as `main.rs` did.
            let skip =
                ["lib", "main", "bin"].contains(&module.as_str()) || module.ends_with("_tests");
            (!skip).then_some(module)
        })
        .collect()
}

/// Every `.rs` file of a module, with its test code cut out.
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
            (p, without_tests(&text))
        })
        .collect()
}

/// The `.rs` files of a folder by stem, their test code cut out (`lib.rs`,
/// `main.rs` and `*_tests.rs` left out).
fn folder_code(dir: &Path) -> BTreeMap<String, String> {
    fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let stem = path.file_name()?.to_str()?.strip_suffix(".rs")?.to_string();
            let skip = stem == "lib" || stem == "main" || stem.ends_with("_tests");
            (!skip).then(|| (stem, without_tests(&fs::read_to_string(&path).unwrap())))
        })
        .collect()
}

#[test]
fn every_module_has_a_layer() {
    let layers = layers_from(&readme());
    let unplaced: Vec<_> = modules()
        .into_iter()
        .filter(|m| layer_of(&layers, m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules missing from the README's layer table: {unplaced:?}"
    );
    let gone: Vec<_> = layers
        .iter()
        .flatten()
        .filter(|m| !modules().contains(*m))
        .collect();
    assert!(
        gone.is_empty(),
        "the README's layer table names modules that do not exist: {gone:?}"
    );
}

#[test]
fn no_module_imports_one_above_it() {
    let layers = layers_from(&readme());
    let modules = modules();
    let mut upward = Vec::new();
    for module in &modules {
        let Some(own) = layer_of(&layers, module) else {
            continue;
        };
        for (path, code) in module_code(module) {
            for (line, named) in named_modules(&code, &modules) {
                if named == *module {
                    continue;
                }
                let theirs = layer_of(&layers, &named).unwrap_or(usize::MAX);
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
fn no_two_files_of_a_module_import_each_other() {
    // Within a module folder, its files (`mod.rs` too: a child that reaches
    // up for an item of `mod.rs` while `mod.rs` uses the child is a circle)
    // each have a place in an order of their own.
    let mut cycles = Vec::new();
    for module in modules().into_iter().filter(|m| src().join(m).is_dir()) {
        let code = folder_code(&src().join(&module));
        let crate_path = format!("crate::{module}");
        cycles.extend(
            folder_cycle(&code, &crate_path).map(|c| format!("{module}/: {}", c.join(" -> "))),
        );
    }
    assert!(
        cycles.is_empty(),
        "files that import each other:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn no_two_files_of_the_stats_crate_import_each_other() {
    let code = folder_code(&root().join("stats/src"));
    let cycle = folder_cycle(&code, "crate");
    assert!(
        cycle.is_none(),
        "stats/src files that import each other: {:?}",
        cycle
    );
}

#[test]
fn no_two_scripts_import_each_other() {
    let dir = root().join("scripts");
    let scripts: BTreeMap<String, String> = fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let stem = path.file_name()?.to_str()?.strip_suffix(".py")?.to_string();
            Some((stem, fs::read_to_string(&path).unwrap()))
        })
        .collect();
    let names: BTreeSet<String> = scripts.keys().cloned().collect();
    let edges = scripts
        .iter()
        .map(|(s, code)| (s.clone(), python_imports(code, &names)))
        .collect();
    let cycle = find_cycle(&edges);
    assert!(cycle.is_none(), "scripts that import each other: {cycle:?}");
}

/// The README's "Code map" table, as text.
fn code_map() -> String {
    let readme = readme();
    let start = readme.find("## Code map").expect("README has a Code map");
    let rest = &readme[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_string()
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
    for e in fs::read_dir(root().join("stats/src")).unwrap() {
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
    let mut bad = Vec::new();
    for dir in [root().join("vmm/tests"), root().join("stats/tests")] {
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

// Self-tests: each check fails on the case it is for.

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
fn code_after_the_test_module_is_still_checked() {
    let modules: BTreeSet<String> = ["run"].iter().map(|s| s.to_string()).collect();
    let text = "fn a() {}\n#[cfg(test)]\nmod tests {\n    use crate::run;\n    fn t() { if x { } }\n}\n\
                #[cfg(test)]\n#[path = \"x_tests.rs\"]\nmod more;\nfn late() { crate::run::go(); }\n";
    let code = without_tests(text);
    assert!(
        !code.contains("mod tests") && !code.contains("x_tests"),
        "{code}"
    );
    assert_eq!(named_modules(&code, &modules).len(), 1, "{code}");
    assert!(code.contains("fn late()"));
}

#[test]
fn a_cycle_through_mod_rs_is_found() {
    // exporter/page.rs names `super::StatFilter` (defined in mod.rs) while
    // mod.rs calls `page::render`: a circle.
    let files = |entries: &[(&str, &str)]| -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(f, c)| (f.to_string(), c.to_string()))
            .collect()
    };
    let circle = files(&[
        (
            "mod",
            "pub(crate) mod page;\npub struct StatFilter;\nfn f() { page::render(); }\n",
        ),
        ("page", "use super::StatFilter;\npub fn render() {}\n"),
    ]);
    assert_eq!(
        folder_cycle(&circle, "crate::exporter"),
        Some(vec!["mod".into(), "page".into(), "mod".into()])
    );
    // The same through the crate path, and a child that only declares
    // (`mod page;`) is no edge.
    let by_path = files(&[
        ("mod", "mod page;\nuse crate::exporter::page::render;\n"),
        ("page", "use crate::exporter::StatFilter;\n"),
    ]);
    assert!(folder_cycle(&by_path, "crate::exporter").is_some());
    let fine = files(&[
        (
            "mod",
            "mod filter;\nmod page;\nfn f() { page::render(); }\n",
        ),
        ("page", "use super::filter::StatFilter;\n"),
        ("filter", "pub struct StatFilter;\n"),
    ]);
    assert_eq!(folder_cycle(&fine, "crate::exporter"), None);
}

#[test]
fn a_cycle_in_a_crate_root_folder_is_found() {
    // The stats crate's files name each other as `crate::file`.
    let code: BTreeMap<String, String> = [
        ("error", "use crate::descriptor::StatError;\n"),
        ("descriptor", "use crate::header::MAX_DATA_SIZE;\n"),
        ("header", "use crate::error::Error;\n"),
    ]
    .iter()
    .map(|(f, c)| (f.to_string(), c.to_string()))
    .collect();
    let cycle = folder_cycle(&code, "crate").expect("a circle");
    assert_eq!(cycle.len(), 4, "{cycle:?}");
}

#[test]
fn a_lazy_python_import_closes_a_circle() {
    let names: BTreeSet<String> = ["runs", "migration", "vm"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let runs = "import os\nfrom migration import run_migration\nfrom vm import Vm\n";
    let migration = "import math, vm\n\ndef log(msg):\n    from runs import log as run_log\n";
    assert_eq!(
        python_imports(runs, &names),
        ["migration", "vm"].iter().map(|s| s.to_string()).collect()
    );
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("runs".to_string(), python_imports(runs, &names)),
        ("migration".to_string(), python_imports(migration, &names)),
    ]
    .into_iter()
    .collect();
    assert!(find_cycle(&edges).is_some());
}

#[test]
fn the_layer_table_is_read_from_the_readme() {
    let text = "Layers of the kvmscope library, lowest first:\n\n| layer | modules |\n|---|---|\n\
                | 1 | `vm`, `run` (a note with `code`) |\n| 0 | `units` |\n\nThreads\n";
    let layers = layers_from(text);
    assert_eq!(layers.len(), 2);
    assert_eq!(layers[0], vec!["units".to_string()]);
    assert_eq!(layers[1], vec!["vm".to_string(), "run".to_string()]);
    assert_eq!(layer_of(&layers, "run"), Some(1));
    // A gap in the numbers is refused.
    let gap = "Layers of the kvmscope library\n| layer | modules |\n|---|---|\n| 2 | `vm` |\n| 0 | `units` |\n";
    assert!(std::panic::catch_unwind(|| layers_from(gap)).is_err());
}

#[test]
fn braces_in_the_code_map_expand() {
    assert_eq!(
        expand_braces("`stats/src/{header,schema}.rs`"),
        "`stats/src/header.rs` `stats/src/schema.rs`"
    );
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
