//! The text side of `tree_layout.rs`: the README's layer table, Rust code
//! without its test items and comments, the modules and files a path names,
//! Python imports, and cycles in a graph of names. Pure functions of text, so
//! that the test's self-tests can feed them made-up code.

use std::collections::{BTreeMap, BTreeSet};

/// The README's layer table ("Layers of the kvmscope library"): the modules
/// of each layer, lowest first. The rows may come in any order; the layer
/// numbers must run from 0 without a gap.
pub fn layers_from(readme: &str) -> Vec<Vec<String>> {
    let start = readme
        .find("Layers of the kvmscope library")
        .expect("README has the layer table");
    let mut by_layer: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let rows = readme[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'));
    for row in rows {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let Some(Ok(layer)) = cells.first().map(|c| c.parse::<usize>()) else {
            continue; // the header and its rule
        };
        // The modules are the backticked names outside parentheses (a note
        // in parentheses may name other things).
        let modules = cells
            .get(1)
            .map(|c| {
                let mut depth = 0usize;
                let outside: String = c
                    .chars()
                    .filter(|&ch| {
                        match ch {
                            '(' => depth += 1,
                            ')' => depth = depth.saturating_sub(1),
                            _ => return depth == 0,
                        }
                        false
                    })
                    .collect();
                outside
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            by_layer.insert(layer, modules).is_none(),
            "layer {layer} is in the README's table twice"
        );
    }
    let layers: Vec<Vec<String>> = by_layer.values().cloned().collect();
    assert!(
        by_layer.keys().copied().eq(0..layers.len()),
        "the README's layers are not numbered 0..{}: {:?}",
        layers.len(),
        by_layer.keys().collect::<Vec<_>>()
    );
    layers
}

pub fn layer_of(layers: &[Vec<String>], module: &str) -> Option<usize> {
    layers.iter().position(|l| l.iter().any(|m| m == module))
}

/// A file's code without its test items: every item under `#[cfg(test)]`
/// (a `mod tests { ... }`, a `#[path] mod tests;`, a test-only `use` or
/// function) is cut out, and the code after it kept.
pub fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        // The item ends at its first `;` outside braces, or at the brace
        // closing its first `{`.
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Code with its `//` comments (and doc comments) blanked out.
pub fn uncommented(code: &str) -> String {
    code.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The top-level modules a file's code names as `crate::x` or within
/// `crate::{x, y::z}` (over several lines too), with their line; comments
/// left out.
pub fn named_modules(code: &str, modules: &BTreeSet<String>) -> Vec<(usize, String)> {
    named_after(code, "crate::", modules)
}

/// As [`named_modules`], for any path prefix (`super::`, `crate::control::`).
pub fn named_after(code: &str, prefix: &str, names: &BTreeSet<String>) -> Vec<(usize, String)> {
    named_after_any(code, prefix)
        .into_iter()
        .filter(|(_, n)| names.contains(n))
        .collect()
}

/// Every identifier a path starting with `prefix` names next, with its line.
pub fn named_after_any(code: &str, prefix: &str) -> Vec<(usize, String)> {
    let code = uncommented(code);
    let mut found = Vec::new();
    let mut push = |at: usize, name: String| {
        if !name.is_empty() {
            found.push((code[..at].matches('\n').count() + 1, name));
        }
    };
    for (at, _) in code.match_indices(prefix) {
        // `crate::` inside `foo_crate::` or `super::` inside `a::super::` is not a path start.
        if code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
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

/// The files of one module folder that `file`'s code names, `mod` standing
/// for the folder's `mod.rs` (`crate_path` is how the folder is named from
/// the crate root, `crate::control`). A child names `mod` by any `super::x`
/// that is not a sibling file; `mod.rs` names a child by `child::`,
/// `self::child` or `crate_path::child`.
pub fn sibling_edges(
    file: &str,
    code: &str,
    files: &BTreeSet<String>,
    crate_path: &str,
) -> BTreeSet<String> {
    let own = format!("{crate_path}::");
    let mut named: Vec<String> = named_after_any(code, &own)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    if file == "mod" {
        named.extend(named_after_any(code, "self::").into_iter().map(|(_, n)| n));
        let code = uncommented(code);
        for child in files.iter().filter(|f| *f != "mod") {
            let bare = code.match_indices(&format!("{child}::")).any(|(at, _)| {
                !code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            });
            if bare {
                named.push(child.clone());
            }
        }
    } else {
        named.extend(named_after_any(code, "super::").into_iter().map(|(_, n)| n));
    }
    named
        .into_iter()
        .map(|n| {
            if files.contains(&n) {
                n
            } else {
                "mod".to_string()
            }
        })
        .filter(|n| n != file && files.contains(n))
        .collect()
}

/// One cycle of `edges`, if there is one, as the names along it.
pub fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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

/// A cycle among the files of one folder, if there is one.
pub fn folder_cycle(code: &BTreeMap<String, String>, crate_path: &str) -> Option<Vec<String>> {
    let files: BTreeSet<String> = code.keys().cloned().collect();
    let edges = code
        .iter()
        .map(|(file, text)| (file.clone(), sibling_edges(file, text, &files, crate_path)))
        .collect();
    find_cycle(&edges)
}

/// The scripts a Python file imports (`import x`, `from x import y`, at any
/// indent: a lazy import inside a function counts), among `scripts`.
pub fn python_imports(code: &str, scripts: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in code.lines().map(str::trim_start) {
        let names: Vec<&str> = if let Some(rest) = line.strip_prefix("from ") {
            rest.split_whitespace().next().into_iter().collect()
        } else if let Some(rest) = line.strip_prefix("import ") {
            let rest = rest.split('#').next().unwrap_or("");
            rest.split(',')
                .filter_map(|n| n.split_whitespace().next())
                .collect()
        } else {
            continue;
        };
        found.extend(
            names
                .into_iter()
                .filter(|n| scripts.contains(*n))
                .map(String::from),
        );
    }
    found
}

/// `stats/src/{a,b}.rs` written out as `stats/src/a.rs`, `stats/src/b.rs`.
pub fn expand_braces(text: &str) -> String {
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
