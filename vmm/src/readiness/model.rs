//! The pre-copy migration model: given what the guest's RAM holds and how fast
//! the guest dirties it, what would a pre-copy live migration move, in how many
//! rounds, and would it converge? docs/READINESS.md writes the model out.
//!
//! Round 0 sends every page: non-zero pages in full, zero pages as a header
//! only (QEMU's `duplicate`/zero-page count). While a round is on the wire the
//! guest dirties `rate × time` pages, capped by its working set; the next round
//! sends those in full. When a round fits `max_downtime`, the VM stops and that
//! round is the downtime. If rounds stop shrinking, it never converges.

// Values here come from the kernel, a peer or the user: casts must not lose,
// wrap or sign-flip them silently; and every public item says what it is.
#![warn(
    missing_docs,
    clippy::cast_lossless,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

use crate::units::saturating_u64;

/// Bytes of a guest page.
pub const PAGE: u64 = 4096;
/// Per-page header on the wire (QEMU: a be64 of address and flags).
pub const HEADER: u64 = 8;
/// A zero page on the wire: the header and one fill byte.
pub const ZERO_PAGE_WIRE: u64 = HEADER + 1;
/// A full page on the wire.
pub const FULL_PAGE_WIRE: u64 = HEADER + PAGE;
/// Rounds tried before giving up (QEMU has no hard cap, but would throttle by then).
pub const MAX_ROUNDS: usize = 30;

/// What the model needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Inputs {
    /// Guest RAM pages.
    pub total_pages: u64,
    /// Pages that must go in full in round 0 (the rest go as zero-page headers).
    pub nonzero_pages: u64,
    /// Pages the guest dirties per second.
    pub dirty_rate: f64,
    /// Most distinct pages the guest dirties in any window (its writable working
    /// set); `None` when unknown, then `total_pages`.
    pub working_set: Option<u64>,
    /// Link bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Longest acceptable stop-and-copy, seconds.
    pub max_downtime: f64,
}

/// One pre-copy round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Round {
    /// Pages sent in the round.
    pub pages: u64,
    /// Bytes on the wire for them (zero pages cost a header only).
    pub bytes: u64,
    /// Time to send them at the bandwidth.
    pub seconds: f64,
}

/// The verdict and its numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Rounds sent while the guest runs (round 0 first).
    pub rounds: Vec<Round>,
    /// The final stop-and-copy round, when it converges.
    pub stop_and_copy: Option<Round>,
    /// Whether a round fits the downtime limit before the model gives up.
    pub converges: bool,
    /// Why it converges or not, in words.
    pub reason: String,
    /// Bytes of every round, stop-and-copy included.
    pub total_bytes: u64,
    /// Seconds of every round, stop-and-copy included.
    pub total_seconds: f64,
    /// Expected downtime (the stop-and-copy round), seconds.
    pub downtime: f64,
}

/// Why the inputs cannot be modelled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The bandwidth is not a positive number.
    #[error("bandwidth must be a positive number of bytes per second, not {0}")]
    Bandwidth(f64),
    /// The downtime limit is not a positive number.
    #[error("max downtime must be a positive number of seconds, not {0}")]
    Downtime(f64),
    /// The dirty rate is negative or not a number.
    #[error("dirty rate must be zero or more pages per second, not {0}")]
    DirtyRate(f64),
    /// More non-zero pages than guest RAM has.
    #[error("{nonzero} non-zero pages is more than the {total} pages of guest RAM")]
    Pages {
        /// Non-zero pages given.
        nonzero: u64,
        /// Pages of guest RAM.
        total: u64,
    },
}

fn round(pages: u64, wire_bytes: u64, bandwidth: f64) -> Round {
    Round {
        pages,
        bytes: wire_bytes,
        seconds: wire_bytes as f64 / bandwidth,
    }
}

/// Runs the model.
///
/// # Errors
/// Inputs that make no sense (non-positive bandwidth or downtime, negative or
/// NaN rate, more non-zero pages than pages).
pub fn predict(i: &Inputs) -> Result<Prediction, Error> {
    if !(i.bandwidth.is_finite() && i.bandwidth > 0.0) {
        return Err(Error::Bandwidth(i.bandwidth));
    }
    if !(i.max_downtime.is_finite() && i.max_downtime > 0.0) {
        return Err(Error::Downtime(i.max_downtime));
    }
    if !(i.dirty_rate.is_finite() && i.dirty_rate >= 0.0) {
        return Err(Error::DirtyRate(i.dirty_rate));
    }
    if i.nonzero_pages > i.total_pages {
        return Err(Error::Pages {
            nonzero: i.nonzero_pages,
            total: i.total_pages,
        });
    }
    let ws = i.working_set.unwrap_or(i.total_pages).min(i.total_pages);
    let zero = i.total_pages - i.nonzero_pages;
    let first = round(
        i.total_pages,
        i.nonzero_pages * FULL_PAGE_WIRE + zero * ZERO_PAGE_WIRE,
        i.bandwidth,
    );
    let mut rounds = vec![first];
    let mut last = first;
    let (converges, reason, stop) = loop {
        let dirtied = saturating_u64((i.dirty_rate * last.seconds).ceil()).min(ws);
        let next = round(dirtied, dirtied * FULL_PAGE_WIRE, i.bandwidth);
        if next.seconds <= i.max_downtime {
            let why = format!("the last round ({} pages, {:.1} ms) fits the {:.0} ms downtime after {} pre-copy round(s)", next.pages, next.seconds * 1e3, i.max_downtime * 1e3, rounds.len());
            break (true, why, Some(next));
        }
        let dirty_bytes = i.dirty_rate * FULL_PAGE_WIRE as f64;
        if next.pages >= last.pages && rounds.len() > 1 || rounds.len() >= MAX_ROUNDS {
            let why = if dirty_bytes >= i.bandwidth {
                format!("the guest dirties {:.1} MiB/s, at least the {:.1} MiB/s link: rounds stop shrinking at {} pages ({:.0} ms, over the {:.0} ms downtime)", dirty_bytes / 1048576.0, i.bandwidth / 1048576.0, next.pages, next.seconds * 1e3, i.max_downtime * 1e3)
            } else {
                format!("after {MAX_ROUNDS} rounds {} pages are still dirty ({:.0} ms on the wire, over the {:.0} ms downtime): the guest dirties {:.1} MiB/s, too close to the {:.1} MiB/s link", next.pages, next.seconds * 1e3, i.max_downtime * 1e3, dirty_bytes / 1048576.0, i.bandwidth / 1048576.0)
            };
            break (false, why, None);
        }
        rounds.push(next);
        last = next;
    };
    let total_bytes = rounds.iter().chain(stop.as_ref()).map(|r| r.bytes).sum();
    let total_seconds = rounds.iter().chain(stop.as_ref()).map(|r| r.seconds).sum();
    Ok(Prediction {
        rounds,
        downtime: stop.map_or(f64::INFINITY, |r| r.seconds),
        stop_and_copy: stop,
        converges,
        reason,
        total_bytes,
        total_seconds,
    })
}

impl Prediction {
    /// The prediction as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let r = |r: &Round| serde_json::json!({ "pages": r.pages, "bytes": r.bytes, "seconds": r.seconds });
        serde_json::json!({
            "converges": self.converges, "reason": self.reason,
            "rounds": self.rounds.iter().map(r).collect::<Vec<_>>(),
            "stop_and_copy": self.stop_and_copy.as_ref().map(r),
            "total_bytes": self.total_bytes, "total_seconds": self.total_seconds,
            "downtime_seconds": if self.downtime.is_finite() { serde_json::json!(self.downtime) } else { serde_json::Value::Null },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    fn inputs() -> Inputs {
        Inputs {
            total_pages: 1000,
            nonzero_pages: 400,
            dirty_rate: 0.0,
            working_set: None,
            bandwidth: 4104.0 * 100.0,
            max_downtime: 0.3,
        }
    }

    #[test]
    fn idle_guest_sends_everything_once_and_converges_with_no_downtime_pages() {
        // Round 0: 400 full pages (400 × 4104 B) + 600 zero pages (600 × 9 B) = 1 641 600 + 5 400 B
        // at 410 400 B/s = 4.013 s; nothing is dirtied, so the stop-and-copy round is empty.
        let p = predict(&inputs()).unwrap();
        assert_eq!(p.rounds.len(), 1);
        assert_eq!(p.rounds[0].bytes, 1_647_000);
        assert!((p.rounds[0].seconds - 1_647_000.0 / 410_400.0).abs() < 1e-9);
        assert_eq!(p.stop_and_copy.unwrap().pages, 0);
        assert!(p.converges);
        assert_eq!(p.total_bytes, 1_647_000);
        assert_eq!(p.downtime, 0.0);
    }

    #[test]
    fn slow_dirtier_converges_in_shrinking_rounds() {
        // Bandwidth 100 pages/s, dirty 10 pages/s, downtime 0.3 s (30 pages).
        // Round 0: 4.0132 s → 41 pages dirtied (ceil 40.13) → round 1: 0.41 s → 5 pages → 0.05 s ≤ 0.3 s: stop.
        let p = predict(&Inputs {
            dirty_rate: 10.0,
            ..inputs()
        })
        .unwrap();
        assert_eq!(
            p.rounds.iter().map(|r| r.pages).collect::<Vec<_>>(),
            vec![1000, 41]
        );
        assert_eq!(p.stop_and_copy.unwrap().pages, 5);
        assert!(p.converges);
        assert!((p.downtime - 0.05).abs() < 1e-9);
        assert_eq!(p.total_bytes, 1_647_000 + 46 * 4104);
    }

    #[test]
    fn dirtying_faster_than_the_link_never_converges() {
        // 150 pages/s dirtied on a 100 pages/s link: every round grows until the
        // whole RAM is dirty, and 1000 pages take 10 s, far over 0.3 s.
        let p = predict(&Inputs {
            dirty_rate: 150.0,
            ..inputs()
        })
        .unwrap();
        assert!(!p.converges);
        assert!(p.reason.contains("at least the"), "{}", p.reason);
        assert_eq!(p.stop_and_copy, None);
        assert!(p.downtime.is_infinite());
        // Round 0 takes 4.013 s → 602 dirty pages (6.02 s) → 903: growing, so it stops there.
        assert_eq!(
            p.rounds.iter().map(|r| r.pages).collect::<Vec<_>>(),
            vec![1000, 602]
        );
        assert!(
            p.reason.contains("stop shrinking at 903 pages"),
            "{}",
            p.reason
        );
    }

    #[test]
    fn small_working_set_converges_even_when_dirtying_fast() {
        // Dirtying faster than the link, but only 20 distinct pages (0.2 s): fits.
        let p = predict(&Inputs {
            dirty_rate: 150.0,
            working_set: Some(20),
            ..inputs()
        })
        .unwrap();
        assert!(p.converges);
        assert_eq!(p.stop_and_copy.unwrap().pages, 20);
    }

    #[test]
    fn working_set_over_the_downtime_never_converges_when_dirtying_fast() {
        // Faster than the link, 50 distinct pages (0.5 s > 0.3 s): every round is 50 pages.
        let p = predict(&Inputs {
            dirty_rate: 150.0,
            working_set: Some(50),
            ..inputs()
        })
        .unwrap();
        assert!(!p.converges);
        assert!(
            p.reason.contains("stop shrinking at 50 pages"),
            "{}",
            p.reason
        );
    }

    #[test]
    fn slower_than_the_link_converges_geometrically() {
        // 90 pages/s on a 100 pages/s link: each round is 0.9 of the last:
        // 1000, 362, 326, ..., until a round fits 0.3 s (30 pages).
        let p = predict(&Inputs {
            dirty_rate: 90.0,
            ..inputs()
        })
        .unwrap();
        assert!(p.converges, "{}", p.reason);
        let pages: Vec<u64> = p.rounds.iter().map(|r| r.pages).collect();
        assert_eq!(&pages[..3], &[1000, 362, 326]);
        assert!(pages.windows(2).skip(1).all(|w| w[1] < w[0]));
        assert!(p.stop_and_copy.unwrap().pages <= 30);
    }

    #[test]
    fn dirtying_just_below_the_link_gives_up_after_max_rounds() {
        let p = predict(&Inputs {
            dirty_rate: 99.0,
            ..inputs()
        })
        .unwrap();
        assert!(!p.converges);
        assert_eq!(p.rounds.len(), MAX_ROUNDS);
        assert!(p.reason.starts_with("after 30 rounds"), "{}", p.reason);
    }

    #[test]
    fn realistic_guest_numbers() {
        // 16 GiB guest, 4 GiB non-zero, 10 Gbit/s, dirtying 20 000 pages/s, 300 ms.
        let total = 16 * 262_144;
        let p = predict(&Inputs {
            total_pages: total,
            nonzero_pages: total / 4,
            dirty_rate: 20_000.0,
            working_set: None,
            bandwidth: 1.25e9,
            max_downtime: 0.3,
        })
        .unwrap();
        assert!(p.converges, "{}", p.reason);
        assert!(p.rounds[0].bytes < saturating_u64(4.1 * 1024.0 * MIB));
    }

    #[test]
    fn rejects_nonsense_inputs() {
        assert_eq!(
            predict(&Inputs {
                bandwidth: 0.0,
                ..inputs()
            })
            .unwrap_err(),
            Error::Bandwidth(0.0)
        );
        assert_eq!(
            predict(&Inputs {
                max_downtime: -1.0,
                ..inputs()
            })
            .unwrap_err(),
            Error::Downtime(-1.0)
        );
        assert!(matches!(
            predict(&Inputs {
                dirty_rate: f64::NAN,
                ..inputs()
            }),
            Err(Error::DirtyRate(_))
        ));
        assert_eq!(
            predict(&Inputs {
                nonzero_pages: 1001,
                ..inputs()
            })
            .unwrap_err(),
            Error::Pages {
                nonzero: 1001,
                total: 1000
            }
        );
    }
}
