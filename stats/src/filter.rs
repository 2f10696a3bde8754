//! Selecting stats by name, like the `names` list of QEMU's `query-stats` providers.

#![forbid(unsafe_code)]

use std::collections::HashSet;

use crate::schema::{Schema, StatId};

/// A set of stat names to report, or all of them. Names may be globs
/// ([`NameFilter::patterns`]): `*` matches any run of characters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameFilter {
    names: Option<HashSet<String>>,
    /// Names with a `*`, matched as globs.
    globs: Vec<String>,
}

/// A pattern that no stat name could match (empty, or characters stat names
/// do not have).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPattern(pub String);

impl std::fmt::Display for BadPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pattern {:?}: use stat names, with * for any run of characters (e.g. halt_*)",
            self.0
        )
    }
}

impl std::error::Error for BadPattern {}

impl NameFilter {
    /// Every stat.
    pub fn all() -> Self {
        Self::default()
    }

    /// Stats matching any of `patterns`: names, `*` matching any run of
    /// characters (none included); no pattern means every stat.
    ///
    /// # Errors
    /// [`BadPattern`] for an empty pattern or one with characters no stat
    /// name has (`[A-Za-z0-9_]` and `*`).
    pub fn patterns(patterns: Vec<String>) -> Result<Self, BadPattern> {
        if let Some(bad) = patterns.iter().find(|p| {
            p.is_empty()
                || !p
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '*')
        }) {
            return Err(BadPattern(bad.clone()));
        }
        if patterns.is_empty() {
            return Ok(Self::all());
        }
        let (globs, names): (Vec<String>, Vec<String>) =
            patterns.into_iter().partition(|p| p.contains('*'));
        Ok(Self {
            names: Some(names.into_iter().collect()),
            globs,
        })
    }

    /// Only the stats named here (names a schema lacks are ignored, as QEMU does).
    pub fn names<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            names: Some(names.into_iter().map(Into::into).collect()),
            globs: Vec::new(),
        }
    }

    /// `None` is every stat, `Some(list)` only those named: the shape of an optional
    /// `names` argument.
    pub fn from_option(names: Option<Vec<String>>) -> Self {
        names.map_or_else(Self::all, Self::names)
    }

    /// True if the filter lets every stat through.
    pub fn is_all(&self) -> bool {
        self.names.is_none()
    }

    /// True if the stat called `name` passes.
    pub fn matches(&self, name: &str) -> bool {
        self.names.as_ref().is_none_or(|names| names.contains(name))
            || self.globs.iter().any(|g| glob(g, name))
    }

    /// The stats of `schema` that pass, in schema order.
    pub fn select(&self, schema: &Schema) -> Vec<StatId> {
        schema
            .iter()
            .filter(|(_, desc)| self.matches(&desc.name))
            .map(|(id, _)| id)
            .collect()
    }

    /// The filter's names and patterns that match none of `names`, sorted
    /// (for a "matches nothing" hint); none for the filter of every stat.
    pub fn unmatched<'n>(&self, names: impl IntoIterator<Item = &'n str>) -> Vec<&str> {
        let Some(wanted) = &self.names else {
            return Vec::new();
        };
        let mut left: Vec<&str> = wanted
            .iter()
            .chain(&self.globs)
            .map(String::as_str)
            .collect();
        for name in names {
            // A name without `*` matches only itself.
            left.retain(|p| !glob(p, name));
            if left.is_empty() {
                break;
            }
        }
        left.sort_unstable();
        left
    }
}

/// `*` matches any run of characters (none included); all else literally.
fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_that_match_no_name_are_told() {
        let f = NameFilter::patterns(vec![
            "exits".into(),
            "pf_*".into(),
            "nosuch".into(),
            "x*y".into(),
        ])
        .unwrap();
        assert_eq!(
            f.unmatched(["exits", "pf_fixed", "halt_exits"]),
            ["nosuch", "x*y"]
        );
        assert_eq!(f.unmatched([]), ["exits", "nosuch", "pf_*", "x*y"]);
        assert!(NameFilter::all().unmatched(["a"]).is_empty());
    }

    #[test]
    fn globs_match_names_prefixes_and_inner_runs() {
        assert!(glob("exits", "exits"));
        assert!(!glob("exits", "io_exits"));
        assert!(glob("halt_*", "halt_wait_ns"));
        assert!(glob("*_exits", "io_exits"));
        assert!(glob("pages_*", "pages_4k"));
        assert!(glob("h*t_*_ns", "halt_wait_ns"));
        assert!(!glob("h*t_*_ns", "halt_poll_fail_hist"));
        assert!(glob("*", "anything"));
    }

    #[test]
    fn patterns_mix_names_and_globs_and_bad_ones_are_refused() {
        assert!(NameFilter::patterns(vec![]).unwrap().matches("exits"));
        let f = NameFilter::patterns(vec!["pages_*".into(), "exits".into()]).unwrap();
        assert!(f.matches("pages_2m") && f.matches("exits") && !f.matches("halt_exits"));
        let err = NameFilter::patterns(vec!["pages 4k".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"pages 4k\""), "{err}");
        assert!(NameFilter::patterns(vec![String::new()]).is_err());
    }
}
