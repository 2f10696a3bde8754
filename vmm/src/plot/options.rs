//! How a chart looks: its size and its bounds, and how rates are scaled.

/// Default chart width in pixels.
pub const DEFAULT_WIDTH: u32 = 1200;
/// Default chart height in pixels.
pub const DEFAULT_HEIGHT: u32 = 700;
/// Smallest width that leaves room for the axes and the legend.
pub const MIN_WIDTH: u32 = 480;
/// Smallest height that leaves room for two panels.
pub const MIN_HEIGHT: u32 = 300;
/// Largest width or height.
pub const MAX_SIDE: u32 = 10_000;

/// How the exit-rate panel scales its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RateScale {
    /// Decades from 1/s up; idle (zero) and bursty rates both stay readable.
    #[default]
    Log,
    /// From zero, for comparing rates of one size.
    Linear,
}

/// How the chart looks.
#[derive(Debug, Clone)]
pub struct ChartOptions {
    /// The title; `None` uses `source`.
    pub title: Option<String>,
    /// Where the series came from (usually its file name), for the title and errors.
    pub source: String,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Draw only this vCPU's rates and phases.
    pub vcpu: Option<usize>,
    /// How the exit-rate panel scales its values.
    pub rates: RateScale,
}

impl Default for ChartOptions {
    fn default() -> Self {
        ChartOptions {
            title: None,
            source: String::new(),
            width: DEFAULT_WIDTH,
            height: DEFAULT_HEIGHT,
            vcpu: None,
            rates: RateScale::Log,
        }
    }
}

/// The largest series a plot reads: about 10 million samples of 2 vCPUs
/// (one took 1.6 GB of memory to draw).
pub(crate) const MAX_SERIES_BYTES: u64 = 1 << 30;
