//! Helpers shared by the vmm benches: order statistics of the measured
//! samples, and the check that skips a bench without KVM.
// Each bench uses the part it needs.
#![allow(dead_code)]

use std::cmp::Ordering;

/// The `p`-quantile (0.0 to 1.0) of `samples` by nearest rank, sorting them
/// in place: `percentile(v, 0.5)` is the median (the upper one of an even
/// count), `percentile(v, 0.99)` the p99.
///
/// # Panics
/// `samples` is empty: a bench that measured nothing has nothing to report.
pub fn percentile<T: Copy + PartialOrd>(samples: &mut [T], p: f64) -> T {
    assert!(!samples.is_empty(), "no samples to take a percentile of");
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    let last = samples.len() - 1;
    // Rounded to the nearest rank; the float is within 0..=last.
    let rank = (last as f64 * p.clamp(0.0, 1.0)).round() as usize;
    samples[rank.min(last)]
}

/// The median of `samples` (sorted in place), see [`percentile`].
pub fn median<T: Copy + PartialOrd>(samples: &mut [T]) -> T {
    percentile(samples, 0.5)
}

/// Whether /dev/kvm can be opened; if not, says that `bench` is skipped.
pub fn kvm_available(bench: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => true,
        Err(e) => {
            println!("{bench} bench: /dev/kvm cannot be opened ({e}); skipped");
            false
        }
    }
}
