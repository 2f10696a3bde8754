//! What a schema uses that this library does not know.
//!
//! The kernel selftest fails a file whose type, unit or base is outside the known ranges. A
//! reader cannot afford that: a newer kernel that adds a unit would break every deployed
//! VMM. So [`crate::Schema::read`] keeps such stats, decoded as `Unknown(raw)`, and lists them
//! here as [`Warning`]s. Callers that want the selftest's strictness use
//! [`crate::Schema::read_strict`] (or [`crate::StatsFd::new_strict`]), which fails with
//! [`crate::Error::Unsupported`] on the first warning.

#![forbid(unsafe_code)]

use crate::descriptor::Descriptor;
pub use crate::error::Warning;
use crate::flags::{Base, StatType, Unit, UNKNOWN_BITS};

/// Lists the warnings of every descriptor, in descriptor order.
pub fn warnings(stats: &[Descriptor]) -> Vec<Warning> {
    stats.iter().flat_map(descriptor_warnings).collect()
}

fn descriptor_warnings(d: &Descriptor) -> Vec<Warning> {
    let stat = || d.name.clone();
    let mut out = Vec::new();
    if let StatType::Unknown(value) = d.kind {
        out.push(Warning::UnknownType {
            stat: stat(),
            value,
        });
    }
    if let Unit::Unknown(_) = d.unit {
        let value = d.unit.to_flags();
        out.push(Warning::UnknownUnit {
            stat: stat(),
            value,
        });
    }
    if let Base::Unknown(_) = d.base {
        let value = d.base.to_flags();
        out.push(Warning::UnknownBase {
            stat: stat(),
            value,
        });
    }
    let bits = d.flags & UNKNOWN_BITS;
    if bits != 0 {
        out.push(Warning::UnknownFlagBits { stat: stat(), bits });
    }
    let scalar = matches!(
        d.kind,
        StatType::Cumulative | StatType::Instant | StatType::Peak
    );
    if scalar && d.size > 1 {
        out.push(Warning::ScalarArray {
            stat: stat(),
            size: d.size,
        });
    }
    out
}
