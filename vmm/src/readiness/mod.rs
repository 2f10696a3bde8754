//! Migration readiness: how much guest RAM is non-zero and how fast the guest
//! dirties it, estimated cheaply from stats and checked against ground truth,
//! and what a pre-copy migration would do with it (docs/READINESS.md).

pub mod dirty;
pub mod model;
pub mod scan;
