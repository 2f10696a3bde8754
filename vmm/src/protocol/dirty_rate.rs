//! QEMU's `calc-dirty-rate` and `query-dirty-rate` (QEMU 7.2's shapes): a
//! dirty rate measured in the background and read when done, as libvirt's
//! `virsh domdirtyrate-calc` and its `dirtyrate` stats group ask for it.

use serde::{Deserialize, Serialize};

/// QEMU's `DirtyRateMeasureMode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirtyRateMode {
    /// Hash a sample of the pages, then again after the window: the share
    /// that changed (no dirty tracking, nothing asked of the guest).
    #[default]
    PageSampling,
    /// The dirty ring over the window (a VM run with `--dirty-log ring`).
    DirtyRing,
    /// The dirty bitmap over the window (a VM run with `--dirty-log bitmap`).
    DirtyBitmap,
}

/// The most seconds a measurement may take (QEMU's range: 1 to 60).
pub const MAX_CALC_TIME: i64 = 60;
/// The fewest and most pages per GiB a page sample may take (QEMU's).
pub const SAMPLE_PAGES: std::ops::RangeInclusive<u64> = 128..=4096;
/// Pages per GiB a page sample takes unless told (QEMU's).
pub const DEFAULT_SAMPLE_PAGES: u64 = 512;

/// `calc-dirty-rate`'s arguments (QEMU 7.2's; QEMU 8.2's `calc-time-unit`
/// is not taken: seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CalcDirtyRateArgs {
    /// Seconds to measure over, 1 to 60.
    pub calc_time: i64,
    /// Pages per GiB to sample (page-sampling only), 128 to 4096.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_pages: Option<u64>,
    /// How to measure (page-sampling unless told).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<DirtyRateMode>,
}

impl CalcDirtyRateArgs {
    /// Checks the ranges as QEMU does, in its words.
    ///
    /// # Errors
    /// The value out of range or out of place, named.
    pub(crate) fn check(&self) -> Result<(), String> {
        if !(1..=MAX_CALC_TIME).contains(&self.calc_time) {
            return Err(format!("calc-time is out of range[1, {MAX_CALC_TIME}]."));
        }
        if let Some(n) = self.sample_pages {
            if self.mode.unwrap_or_default() != DirtyRateMode::PageSampling {
                return Err("sample-pages is used only in page-sampling mode".into());
            }
            if !SAMPLE_PAGES.contains(&n) {
                return Err(format!(
                    "sample-pages is out of range[{}, {}].",
                    SAMPLE_PAGES.start(),
                    SAMPLE_PAGES.end()
                ));
            }
        }
        Ok(())
    }
}

/// QEMU's `DirtyRateStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirtyRateStatus {
    /// Never asked for.
    Unstarted,
    /// A measurement runs.
    Measuring,
    /// The last measurement's figures are in.
    Measured,
}

/// One vCPU's dirty rate (QEMU's `DirtyRateVcpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DirtyRateVcpu {
    /// The vCPU's index.
    pub id: usize,
    /// Its dirty rate, MB/s.
    pub dirty_rate: i64,
}

/// `query-dirty-rate`'s return (QEMU 7.2's `DirtyRateInfo`, with kvmscope's
/// `x-` additions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DirtyRateInfo {
    /// The dirty rate, MB/s (2^20 bytes), once measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_rate: Option<i64>,
    /// Where the measurement stands.
    pub status: DirtyRateStatus,
    /// When the last measurement started, seconds since the epoch (as newer
    /// QEMU's; 0 before any).
    pub start_time: i64,
    /// Its length, seconds.
    pub calc_time: i64,
    /// Its pages per GiB sampled (page-sampling).
    pub sample_pages: u64,
    /// How it measured.
    pub mode: DirtyRateMode,
    /// Each vCPU's rate, in dirty-ring mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu_dirty_rate: Option<Vec<DirtyRateVcpu>>,
    /// kvmscope: what the window's dirty tracking cost the guest, ms, in
    /// dirty-ring and dirty-bitmap mode (page sampling costs it nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_guest_stall_ms: Option<f64>,
    /// kvmscope: why the last measurement failed, if it did (its status is
    /// then `measured`, with no `dirty-rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_error: Option<String>,
}

impl Default for DirtyRateInfo {
    fn default() -> Self {
        DirtyRateInfo {
            dirty_rate: None,
            status: DirtyRateStatus::Unstarted,
            start_time: 0,
            calc_time: 0,
            // QEMU 7.2's: 0 until a page-sampling measurement.
            sample_pages: 0,
            mode: DirtyRateMode::PageSampling,
            vcpu_dirty_rate: None,
            x_guest_stall_ms: None,
            x_error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_in_qemus_words() {
        let args = |calc_time, sample_pages, mode| CalcDirtyRateArgs {
            calc_time,
            sample_pages,
            mode,
        };
        assert!(args(1, None, None).check().is_ok());
        assert!(args(60, Some(128), Some(DirtyRateMode::PageSampling))
            .check()
            .is_ok());
        assert_eq!(
            args(0, None, None).check().unwrap_err(),
            "calc-time is out of range[1, 60]."
        );
        assert_eq!(
            args(61, None, None).check().unwrap_err(),
            "calc-time is out of range[1, 60]."
        );
        assert_eq!(
            args(1, Some(4097), None).check().unwrap_err(),
            "sample-pages is out of range[128, 4096]."
        );
        assert_eq!(
            args(1, Some(512), Some(DirtyRateMode::DirtyRing))
                .check()
                .unwrap_err(),
            "sample-pages is used only in page-sampling mode"
        );
    }

    #[test]
    fn before_any_measurement_the_info_is_qemus_unstarted_one() {
        let v = serde_json::to_value(DirtyRateInfo::default()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"status": "unstarted", "start-time": 0, "calc-time": 0,
                               "sample-pages": 0, "mode": "page-sampling"})
        );
    }
}
