//! Selecting stats by name, like the `names` list of QEMU's `query-stats` providers.

#![forbid(unsafe_code)]

use std::collections::HashSet;

use crate::schema::{Schema, StatId};

/// A set of stat names to report, or all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameFilter {
    names: Option<HashSet<String>>,
}

impl NameFilter {
    /// Every stat.
    pub fn all() -> Self {
        Self { names: None }
    }

    /// Only the stats named here (names a schema lacks are ignored, as QEMU does).
    pub fn names<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            names: Some(names.into_iter().map(Into::into).collect()),
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
    }

    /// The stats of `schema` that pass, in schema order.
    pub fn select(&self, schema: &Schema) -> Vec<StatId> {
        schema
            .iter()
            .filter(|(_, desc)| self.matches(&desc.name))
            .map(|(id, _)| id)
            .collect()
    }

    /// Names in the filter that `schema` does not have, sorted (for a "no such stat" hint).
    pub fn missing(&self, schema: &Schema) -> Vec<&str> {
        let Some(names) = &self.names else {
            return Vec::new();
        };
        let mut out: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| schema.find(n).is_none())
            .collect();
        out.sort_unstable();
        out
    }
}
