//! The chart, drawn with plotters on any backend (SVG or an RGB buffer):
//! panels sharing the time axis (mapped bytes by page size on top, exit rates
//! per vCPU below; when the series carries them, the guest's own progress and
//! the vCPU time it lost to dirty tracking and throttling), phase markers
//! across them all, a title, and the legend in the right margin (`legend.rs`).

use std::ops::Range;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::axes::{self, ByteAxis, RateAxis};
use super::error::PlotError;
use super::markers::{self, PhaseChange};
use super::options::{ChartOptions, RateScale, MAX_SIDE, MIN_HEIGHT, MIN_WIDTH};
use crate::sampler::record::{Point, SeriesHeader, VcpuPoint};
use crate::units::{format_bytes, saturating_usize};

/// What a drawing call returns: plotters' error for the backend in use.
pub(super) type Drawing<T, DB> = Result<T, DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Margins around the panels, in pixels: y labels, legend, title, x labels.
const LEFT: u32 = 84;
const LEFT_PX: i32 = 84;
pub(super) const RIGHT: u32 = 215;
const TOP: u32 = 64;
const BOTTOM: u32 = 52;
/// Space between the two panels.
const GAP: u32 = 26;
/// Phase changes closer than this share one marker line.
const MARKER_MIN_PX: f64 = 13.0;
/// Rough width of one character of a marker label, to cut labels that would not fit.
const LABEL_CHAR_PX: f64 = 6.4;
/// Width of a character of a bold axis title, pixels (an upper bound).
const TITLE_CHAR_PX: f64 = 8.0;
/// Text sizes as plotters counts them (an SVG `font-size` of size / 1.24).
pub(super) const TEXT: f64 = 13.6;
const TITLE: f64 = 21.0;

pub(super) const INK: RGBColor = RGBColor(0x22, 0x22, 0x22);
const GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);
const GRID: RGBColor = RGBColor(0xe4, 0xe4, 0xe4);
const FRAME: RGBColor = RGBColor(0xc8, 0xc8, 0xc8);
const PANEL: RGBColor = RGBColor(0xfc, 0xfc, 0xfc);

/// The colour of the total-mapped line.
pub const TOTAL_COLOR: RGBColor = INK;

/// One colour per vCPU (Tableau 10), repeating after ten.
const VCPU_COLORS: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xba, 0xb0, 0xac),
];

/// Page-size layers, bottom to top: legend name, fill, bytes per page.
pub(super) const LAYERS: [(&str, RGBColor, f64); 3] = [
    ("4 KiB pages", RGBColor(0x9e, 0xca, 0xe1), 4096.0),
    ("2 MiB pages", RGBColor(0xfd, 0xae, 0x6b), 2_097_152.0),
    ("1 GiB pages", RGBColor(0xa1, 0xd9, 0x9b), 1_073_741_824.0),
];

/// Which of a vCPU's two exit rates a line shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// KVM's `exits` stat: every exit, handled in the kernel or not (a thick line).
    Kvm,
    /// Exits that reached this VMM (a thin line in a lighter shade).
    Ours,
}

impl Rate {
    fn of(self, v: &VcpuPoint) -> f64 {
        match self {
            Rate::Kvm => v.exits_per_s,
            Rate::Ours => v.our_exits_per_s,
        }
    }

    /// The line's style in `color`.
    pub(super) fn style(self, color: RGBColor) -> ShapeStyle {
        match self {
            Rate::Kvm => color.stroke_width(2),
            Rate::Ours => color.stroke_width(1),
        }
    }
}

/// The colour of `vcpu`'s line for `rate`: the vCPU's colour for KVM's rate,
/// half-way to white for ours.
pub fn rate_color(vcpu: usize, rate: Rate) -> RGBColor {
    let RGBColor(r, g, b) = VCPU_COLORS[vcpu % VCPU_COLORS.len()];
    match rate {
        Rate::Kvm => RGBColor(r, g, b),
        Rate::Ours => RGBColor(lighten(r), lighten(g), lighten(b)),
    }
}

fn lighten(c: u8) -> u8 {
    c.saturating_add((255 - c) / 2)
}

/// Bytes mapped with one page size. In floating point, so no count can overflow.
fn layer_bytes(p: &Point, layer: usize) -> f64 {
    let pages = [p.pages_4k, p.pages_2m, p.pages_1g];
    pages[layer] as f64 * LAYERS[layer].2
}

fn total_bytes(p: &Point) -> f64 {
    (0..LAYERS.len()).map(|k| layer_bytes(p, k)).sum()
}

/// Checks the chart size before anything is read.
///
/// # Errors
/// `PlotError::BadSize` outside `MIN_WIDTH`/`MIN_HEIGHT` to `MAX_SIDE`.
pub(crate) fn check_size(opts: &ChartOptions) -> Result<(), PlotError> {
    let ok = (MIN_WIDTH..=MAX_SIDE).contains(&opts.width)
        && (MIN_HEIGHT..=MAX_SIDE).contains(&opts.height);
    if ok {
        Ok(())
    } else {
        Err(PlotError::BadSize {
            width: opts.width,
            height: opts.height,
        })
    }
}

/// A series ready to draw: samples with a finite time, the vCPUs shown, and
/// the axes derived from them.
pub(crate) struct Chart<'a> {
    opts: &'a ChartOptions,
    header: &'a SeriesHeader,
    pub(super) points: Vec<&'a Point>,
    pub(super) vcpus: Vec<usize>,
    /// vCPUs in the series, shown or not.
    available: usize,
    pub(super) layers: [bool; 3],
    pub(super) changes: Vec<PhaseChange>,
    time: Range<f64>,
    bytes: ByteAxis,
    rates: RateAxis,
    /// The guest's own progress per second (a third panel), when the series
    /// carries it (guest ABI `progress`; older series and other guests do not).
    progress: Option<RateAxis>,
    /// Each point's share of each shown vCPU's time lost since the point
    /// before, % ([`Lost`]), and the axis for it: a panel of its own when
    /// the series shows any loss (the guest columns; older series lack them).
    lost: Option<(Vec<Vec<Lost>>, RateAxis)>,
    /// Whether text is drawn (not when a bitmap has no font to draw it with).
    text: bool,
}

impl<'a> Chart<'a> {
    /// Validates the options against the series and derives the axes.
    ///
    /// # Errors
    /// A bad size, no sample with a finite time, or a `vcpu` the series lacks.
    pub(crate) fn new(
        header: &'a SeriesHeader,
        points: &'a [Point],
        opts: &'a ChartOptions,
    ) -> Result<Self, PlotError> {
        check_size(opts)?;
        let mut points: Vec<&Point> = points.iter().filter(|p| p.time_s.is_finite()).collect();
        if !points.is_sorted_by(|a, b| a.time_s <= b.time_s) {
            // Drawn in file order, lines went back and forth, and the
            // stacked memory areas disagreed with their total.
            log::warn!(
                "{}: its samples are not in time order (joined runs, or edited): drawn in time order",
                opts.source
            );
            points.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
        }
        if points.is_empty() {
            return Err(PlotError::EmptySeries {
                name: opts.source.clone(),
            });
        }
        let available = points.iter().map(|p| p.vcpus.len()).max().unwrap_or(0);
        let vcpus = match opts.vcpu {
            Some(v) if v < available => vec![v],
            Some(vcpu) => {
                return Err(PlotError::NoSuchVcpu {
                    vcpu,
                    vcpus: available,
                })
            }
            None => (0..available).collect(),
        };
        let t0 = points
            .iter()
            .map(|p| p.time_s)
            .fold(f64::INFINITY, f64::min);
        let t1 = points
            .iter()
            .map(|p| p.time_s)
            .fold(f64::NEG_INFINITY, f64::max);
        if !(t1 - t0).is_finite() {
            // Each time finite, their span not (-1e308 to 1e308): the axis'
            // key points were computed for ever.
            return Err(PlotError::TimeSpan {
                name: opts.source.clone(),
                first: t0,
                last: t1,
            });
        }
        let max_bytes = points.iter().map(|p| total_bytes(p)).fold(0.0, f64::max);
        let max_rate = max_rate(&points, &vcpus);
        let max_progress = max_progress(&points, &vcpus);
        let lost = lost_shares(&points, &vcpus);
        let max_lost = lost
            .iter()
            .flatten()
            .flat_map(|l| [l.stall, l.throttled])
            .flatten()
            .fold(0.0, f64::max);
        let axis = |max| match opts.rates {
            RateScale::Log => RateAxis::log(max),
            RateScale::Linear => RateAxis::linear(max),
        };
        Ok(Chart {
            opts,
            header,
            layers: [0, 1, 2].map(|k| points.iter().any(|p| layer_bytes(p, k) > 0.0)),
            changes: markers::phase_changes(&points, &vcpus),
            points,
            vcpus,
            available,
            time: axes::time_range(t0, t1),
            bytes: ByteAxis::new(max_bytes),
            rates: axis(max_rate),
            progress: (max_progress > 0.0).then(|| axis(max_progress)),
            lost: (max_lost > 0.0).then(|| (lost, RateAxis::linear(max_lost.min(100.0)))),
            text: true,
        })
    }

    /// Leaves all text out (for a bitmap with no font to draw it with).
    pub(crate) fn without_text(mut self) -> Self {
        self.text = false;
        self
    }

    /// Draws the chart on `root`, the whole image; returns the marker lines drawn.
    pub(crate) fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Drawing<usize, DB> {
        root.fill(&WHITE)?;
        self.draw_title(root)?;
        let (w, h) = root.dim_in_pixel();
        let panel_h = self.panel_height(h);
        let width = w.saturating_sub(RIGHT);
        let px = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        let top = root.clone().shrink((0, TOP), (width, panel_h));
        let x_of = self.draw_bytes(&top)?;
        let upper = (px(TOP), px(TOP + panel_h));
        // The n-th panel below the first: its area (labels included) and plot rows.
        let nth = |n: u32| {
            let y = TOP + panel_h + GAP + (n - 1) * (panel_h + BOTTOM + GAP);
            let area = root.clone().shrink((0, y), (width, panel_h + BOTTOM));
            (area, (px(y), px(y + panel_h)))
        };
        let (area, lower) = nth(1);
        self.draw_rates(&area)?;
        let mut rows = Rows {
            upper,
            lower,
            progress: None,
            lost: None,
        };
        let mut next = 2;
        if let Some(axis) = &self.progress {
            let (area, row) = nth(next);
            self.draw_progress(&area, axis)?;
            rows.progress = Some(row);
            next += 1;
        }
        if let Some((shares, axis)) = &self.lost {
            let (area, row) = nth(next);
            self.draw_lost(&area, shares, axis)?;
            rows.lost = Some(row);
        }
        let last = rows.lost.or(rows.progress).unwrap_or(lower).1;
        let markers = self.draw_markers(root, &x_of, (upper.0, last), panel_h)?;
        self.draw_legend(root, px(width + 18), &rows)?;
        Ok(markers)
    }

    /// A panel's y title: `long` where it fits along the panel's height,
    /// else `short` (a title longer than its panel runs into the next).
    fn title<'t>(&self, long: &'t str, short: &'t str) -> &'t str {
        let panel_h = self.panel_height(self.opts.height);
        if long.chars().count() as f64 * TITLE_CHAR_PX <= f64::from(panel_h) {
            long
        } else {
            short
        }
    }

    /// Each panel's plot height in an image `h` pixels high (panels below
    /// the first carry time labels under them).
    fn panel_height(&self, h: u32) -> u32 {
        let below = self.panels() - 1;
        h.saturating_sub(TOP + below * (BOTTOM + GAP)) / (below + 1)
    }

    /// Panels drawn: mapped memory, exit rates, and the guest's where the
    /// series carries them.
    fn panels(&self) -> u32 {
        2 + u32::from(self.progress.is_some()) + u32::from(self.lost.is_some())
    }

    /// A text style in `color`, invisible when text is left out.
    pub(super) fn font(&self, size: f64, color: RGBColor) -> TextStyle<'static> {
        let alpha = if self.text { 1.0 } else { 0.0 };
        TextStyle {
            font: FontDesc::new(FontFamily::SansSerif, size, FontStyle::Normal),
            color: color.mix(alpha).to_backend_color(),
            pos: Pos::default(),
        }
    }

    /// As `font`, bold.
    pub(super) fn bold(&self, size: f64, color: RGBColor) -> TextStyle<'static> {
        let style = self.font(size, color);
        TextStyle {
            font: FontDesc::new(FontFamily::SansSerif, size, FontStyle::Bold),
            ..style
        }
    }

    fn draw_title<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawing<(), DB> {
        // Given, else the VM's name with the file's, else the file's.
        let title = match (&self.opts.title, self.header.name.as_str()) {
            (Some(t), _) => t.clone(),
            (None, "") => self.opts.source.clone(),
            (None, name) => format!("{name}  ({})", self.opts.source),
        };
        let x = LEFT_PX;
        root.draw(&Text::new(clean(&title), (x, 12), self.bold(TITLE, INK)))?;
        root.draw(&Text::new(self.subtitle(), (x, 36), self.font(TEXT, GREY)))
    }

    /// What the header says about the run, and how much the series covers.
    fn subtitle(&self) -> String {
        let h = self.header;
        let mut parts = Vec::new();
        let backend = h
            .backend
            .get("description")
            .or_else(|| h.backend.get("kind"));
        if let Some(b) = backend.and_then(|b| b.as_str()) {
            parts.push(clean(b));
        }
        let n = h.vcpus.max(self.available);
        parts.push(match self.opts.vcpu {
            Some(v) => format!("vCPU {v} of {n}"),
            None => format!("{n} vCPU{}", if n == 1 { "" } else { "s" }),
        });
        if h.memory > 0 {
            parts.push(format!("{} RAM", format_bytes(h.memory)));
        }
        if h.interval_ms.is_finite() && h.interval_ms > 0.0 {
            parts.push(format!("sampled every {} ms", axes::si(h.interval_ms)));
        }
        let span = self.time_span();
        let n = self.points.len();
        let samples = if n == 1 { "sample" } else { "samples" };
        parts.push(format!("{n} {samples} over {span:.2} s"));
        parts.join("  ·  ")
    }

    /// Seconds from the first sample to the last.
    fn time_span(&self) -> f64 {
        let t = self.points.iter().map(|p| p.time_s);
        t.clone().fold(f64::NEG_INFINITY, f64::max) - t.fold(f64::INFINITY, f64::min)
    }

    /// The top panel: stacked areas per page size and the total as a line on
    /// top. Returns the time axis' mapping to pixels, for the markers.
    fn draw_bytes<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> Drawing<impl Fn(f64) -> i32, DB> {
        let mut chart = ChartBuilder::on(area)
            .y_label_area_size(LEFT)
            .build_cartesian_2d(self.time.clone(), 0.0..self.bytes.top)?;
        let label = |v: &f64| self.bytes.label(*v);
        let title = self.title("mapped guest memory", "mapped memory");
        self.panel(&mut chart, title, &label)?;
        let mut below = vec![0.0; self.points.len()];
        let at = |(p, b): (&&Point, &f64)| (p.time_s, self.bytes.y(*b));
        // Each boundary thinned once: a layer's top is the next one's
        // bottom, point for point (thinned apart, the two could keep
        // different samples where a column ties, and leave a seam).
        let mut lower = thinned(
            self.points.iter().zip(&below).map(at).collect(),
            chart.as_coord_spec(),
        );
        for (k, (_, fill, _)) in LAYERS.iter().enumerate() {
            if !self.layers[k] {
                continue;
            }
            let above: Vec<f64> = below
                .iter()
                .zip(&self.points)
                .map(|(b, p)| b + layer_bytes(p, k))
                .collect();
            let upper = thinned(
                self.points.iter().zip(&above).map(at).collect(),
                chart.as_coord_spec(),
            );
            let outline: Vec<(f64, f64)> =
                upper.iter().chain(lower.iter().rev()).copied().collect();
            chart.draw_series(std::iter::once(Polygon::new(outline, fill.filled())))?;
            below = above;
            lower = upper;
        }
        let total: Vec<(f64, f64)> = self
            .points
            .iter()
            .map(|p| (p.time_s, self.bytes.y(total_bytes(p))))
            .collect();
        draw_line(&mut chart, total, TOTAL_COLOR.stroke_width(2))?;
        let spec: Cartesian2d<RangedCoordf64, RangedCoordf64> = chart.as_coord_spec().clone();
        Ok(move |t: f64| spec.translate(&(t, 0.0)).0)
    }

    /// The bottom panel: per vCPU, KVM's exit rate and ours, in the vCPU's colours.
    fn draw_rates<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Drawing<(), DB> {
        let title = match self.rates {
            RateAxis::Log { .. } => self.title("exits/s (log scale)", "exits/s (log)"),
            RateAxis::Linear { .. } => "exits/s",
        };
        let label = |v: &f64| self.rates.label(*v);
        let mut chart = self.rate_panel(area, &self.rates, title, &label)?;
        for &vcpu in &self.vcpus {
            for rate in [Rate::Kvm, Rate::Ours] {
                let style = rate.style(rate_color(vcpu, rate));
                for run in self.rate_runs(vcpu, rate) {
                    draw_line(&mut chart, run, style)?;
                }
            }
        }
        Ok(())
    }

    /// The third panel: per vCPU, the guest's own count of its work per
    /// second (what a throttle, a dirty limit or tracking took from it).
    fn draw_progress<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        axis: &RateAxis,
    ) -> Drawing<(), DB> {
        let title = match axis {
            RateAxis::Log { .. } => self.title("guest units/s (log)", "guest units/s"),
            RateAxis::Linear { .. } => "guest units/s",
        };
        let label = |v: &f64| axis.label(*v);
        let mut chart = self.rate_panel(area, axis, title, &label)?;
        for &vcpu in &self.vcpus {
            let style = rate_color(vcpu, Rate::Kvm).stroke_width(2);
            for run in runs(&self.points, axis, |_, p| {
                p.vcpus.get(vcpu).map(|v| v.progress_per_s)
            }) {
                draw_line(&mut chart, run, style)?;
            }
        }
        Ok(())
    }

    /// The last panel: per vCPU, the share of its time lost since the sample
    /// before to dirty tracking (its stall, a thick line in its colour) and
    /// to a throttle or dirty limit (asleep, a thin line in a lighter shade).
    fn draw_lost<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        shares: &[Vec<Lost>],
        axis: &RateAxis,
    ) -> Drawing<(), DB> {
        let label = |v: &f64| format!("{} %", axis.label(*v));
        let title = self.title("vCPU time lost (%)", "time lost (%)");
        let mut chart = self.rate_panel(area, axis, title, &label)?;
        for (k, &vcpu) in self.vcpus.iter().enumerate() {
            let kinds: [(Rate, LostOf); 2] =
                [(Rate::Kvm, |l| l.stall), (Rate::Ours, |l| l.throttled)];
            for (rate, of) in kinds {
                let style = rate.style(rate_color(vcpu, rate));
                for run in runs(&self.points, axis, |i, _| {
                    shares.get(i).and_then(|s| of(&s[k]))
                }) {
                    draw_line(&mut chart, run, style)?;
                }
            }
        }
        Ok(())
    }

    /// A panel under the top one: time along the bottom (with its tick
    /// labels), `axis` up the side, drawn by [`Self::panel`].
    fn rate_panel<'p, DB: DrawingBackend>(
        &self,
        area: &'p DrawingArea<DB, Shift>,
        axis: &RateAxis,
        title: &str,
        y_label: &dyn Fn(&f64) -> String,
    ) -> Drawing<ChartContext<'p, DB, Cartesian2d<RangedCoordf64, RateAxis>>, DB> {
        let mut chart = ChartBuilder::on(area)
            .y_label_area_size(LEFT)
            .x_label_area_size(BOTTOM)
            .build_cartesian_2d(self.time.clone(), axis.clone())?;
        self.panel(&mut chart, title, y_label)?;
        Ok(chart)
    }

    /// One rate's line in runs of samples with a finite rate.
    fn rate_runs(&self, vcpu: usize, rate: Rate) -> Vec<Vec<(f64, f64)>> {
        runs(&self.points, &self.rates, |_, p| {
            p.vcpus.get(vcpu).map(|v| rate.of(v))
        })
    }

    /// A panel's background, grid, frame, tick labels and axis titles, and
    /// with one vCPU shown, a faint band per phase coloured by its command.
    fn panel<DB: DrawingBackend, Y>(
        &self,
        chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, Y>>,
        title: &str,
        y_label: &dyn Fn(&f64) -> String,
    ) -> Drawing<(), DB>
    where
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        chart.plotting_area().fill(&PANEL)?;
        let y = chart.y_range();
        if self.vcpus.len() == 1 {
            let ends = self
                .changes
                .iter()
                .skip(1)
                .map(|c| c.time_s)
                .chain([self.time.end]);
            let bands = self.changes.iter().zip(ends).map(|(c, end)| {
                let color = markers::command_color(c.code).mix(0.07);
                Rectangle::new([(c.time_s, y.start), (end, y.end)], color.filled())
            });
            chart.draw_series(bands)?;
        }
        let x_label = |v: &f64| axes::number(*v);
        chart
            .configure_mesh()
            .x_labels(8)
            .y_labels(6)
            .light_line_style(TRANSPARENT)
            .bold_line_style(GRID)
            .axis_style(FRAME)
            .label_style(self.font(TEXT, INK))
            .axis_desc_style(self.bold(TEXT, INK))
            .x_label_formatter(&x_label)
            .y_label_formatter(y_label)
            .x_desc("time (s)")
            .y_desc(title)
            .draw()?;
        let frame = [(self.time.start, y.start), (self.time.end, y.end)];
        chart.draw_series(std::iter::once(Rectangle::new(frame, FRAME)))?;
        Ok(())
    }

    /// A dashed line per phase change (or per cluster of them) from the top of
    /// the upper panel to the bottom of the lower, labelled along it; returns
    /// how many lines it drew.
    fn draw_markers<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        x_of: &dyn Fn(f64) -> i32,
        (y0, y1): (i32, i32),
        panel_h: u32,
    ) -> Drawing<usize, DB> {
        let groups = markers::group(&self.changes, |t| f64::from(x_of(t)), MARKER_MIN_PX);
        // A label runs down the top panel only.
        let max_chars = saturating_usize(((f64::from(panel_h) - 10.0) / LABEL_CHAR_PX).max(4.0));
        for g in &groups {
            let (x, color) = (x_of(g.time_s), markers::command_color(g.code));
            let rule = [(x, y0), (x, y1)];
            root.draw(&DashedPathElement::new(rule, 4, 3, color.stroke_width(1)))?;
            // Read upwards, left of the rule, unless that would run into the y axis.
            let lx = if x - LEFT_PX < 14 { x + 13 } else { x - 2 };
            let style = self
                .font(TEXT, color)
                .transform(FontTransform::Rotate270)
                .pos(Pos::new(HPos::Right, VPos::Bottom));
            root.draw(&Text::new(
                clean(&shorten(&g.label, max_chars)),
                (lx, y0 + 5),
                style,
            ))?;
        }
        Ok(groups.len())
    }
}

/// Draws `points` as a line, or as a dot when there is only one. A line
/// wider than a pixel is cut at each turn sharper than a right angle (the
/// pieces share the vertex): a bitmap joins wide segments with a miter of
/// no limit, which at a spike (up one sample, down the next) reaches far
/// past both, out of the panel.
fn draw_line<DB: DrawingBackend, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, Y>>,
    points: Vec<(f64, f64)>,
    style: ShapeStyle,
) -> Drawing<(), DB> {
    if let [only] = points[..] {
        chart.draw_series(std::iter::once(Circle::new(only, 3, style.color.filled())))?;
        return Ok(());
    }
    let points = thinned(points, chart.as_coord_spec());
    let pieces = if style.stroke_width > 1 {
        let spec = chart.as_coord_spec();
        let px: Vec<(i32, i32)> = points.iter().map(|p| spec.translate(p)).collect();
        sharp_turns(&px)
    } else {
        Vec::new()
    };
    let mut start = 0;
    for end in pieces.into_iter().chain([points.len() - 1]) {
        let piece = points[start..=end].to_vec();
        chart.draw_series(std::iter::once(PathElement::new(piece, style)))?;
        start = end;
    }
    Ok(())
}

/// `points` as a path draws them one pixel column at a time: of the points
/// that fall in one column, the first, the highest, the lowest and the
/// last, in their order. A line through these covers the pixels a line
/// through all does (each column: the way in, its whole height, the way
/// out), with at most four points a column: a 30,000-sample series drew a
/// 3.2 MB SVG, a day's at 100 ms would draw some 90 MB. A filled outline
/// differs within a column only (its edge is drawn between the kept
/// points).
fn thinned<Y: Ranged<ValueType = f64>>(
    points: Vec<(f64, f64)>,
    spec: &Cartesian2d<RangedCoordf64, Y>,
) -> Vec<(f64, f64)> {
    let px: Vec<(i32, i32)> = points.iter().map(|p| spec.translate(p)).collect();
    column_extremes(&px)
        .into_iter()
        .map(|i| points[i])
        .collect()
}

/// Indexes of [`thinned`]'s points: per run of consecutive pixels in one
/// column, the first, the highest, the lowest and the last.
fn column_extremes(px: &[(i32, i32)]) -> Vec<usize> {
    let mut keep = Vec::new();
    let mut i = 0;
    while i < px.len() {
        let (mut last, mut high, mut low) = (i, i, i);
        while px.get(last + 1).is_some_and(|p| p.0 == px[i].0) {
            last += 1;
            if px[last].1 < px[high].1 {
                high = last;
            }
            if px[last].1 > px[low].1 {
                low = last;
            }
        }
        let mut column = [i, high, low, last];
        column.sort_unstable();
        for k in column {
            if keep.last() != Some(&k) {
                keep.push(k);
            }
        }
        i = last + 1;
    }
    keep
}

/// Indexes of the vertices of a pixel path where it turns by more than a
/// right angle (the segments before and after point apart). Repeated
/// points (several samples on one pixel) are one vertex, judged at the
/// first of them, as the bitmap backend joins them.
fn sharp_turns(px: &[(i32, i32)]) -> Vec<usize> {
    let d = |a: (i32, i32), b: (i32, i32)| (i64::from(b.0 - a.0), i64::from(b.1 - a.1));
    let mut turns = Vec::new();
    let mut before: Option<(i32, i32)> = None;
    for (i, &here) in px.iter().enumerate() {
        if i > 0 && px[i - 1] == here {
            continue;
        }
        let Some(from) = before else {
            before = Some(here);
            continue;
        };
        let Some(&to) = px[i + 1..].iter().find(|&&p| p != here) else {
            break;
        };
        let (u, v) = (d(from, here), d(here, to));
        if u.0 * v.0 + u.1 * v.1 < 0 {
            turns.push(i);
        }
        before = Some(here);
    }
    turns
}

/// A line in runs of samples with a finite value on `axis` (`value` is
/// given each sample and its index): the pen lifts over samples that lack
/// the vCPU or whose value is NaN or infinite.
fn runs(
    points: &[&Point],
    axis: &RateAxis,
    value: impl Fn(usize, &Point) -> Option<f64>,
) -> Vec<Vec<(f64, f64)>> {
    let (mut runs, mut run) = (Vec::new(), Vec::new());
    for (i, p) in points.iter().enumerate() {
        match value(i, p).filter(|r| r.is_finite()) {
            Some(r) => run.push((p.time_s, axis.y(r))),
            None if !run.is_empty() => runs.push(std::mem::take(&mut run)),
            None => {}
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

/// The pixel rows (top, bottom) of each panel drawn, for the legend.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rows {
    pub(super) upper: (i32, i32),
    pub(super) lower: (i32, i32),
    pub(super) progress: Option<(i32, i32)>,
    pub(super) lost: Option<(i32, i32)>,
}

/// Which of a [`Lost`]'s shares a line draws.
type LostOf = fn(&Lost) -> Option<f64>;

/// One vCPU's time lost between two samples, % of the time between them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Lost {
    /// To dirty tracking (its stall).
    pub(crate) stall: Option<f64>,
    /// Asleep for a throttle or a dirty limit.
    pub(crate) throttled: Option<f64>,
}

/// Per point, per vCPU shown (in `vcpus`' order), the share of its time
/// lost since the point before: none for the first point, for a vCPU a
/// point lacks, or where a count went down (a migration's destination
/// counts from its own start).
pub(crate) fn lost_shares(points: &[&Point], vcpus: &[usize]) -> Vec<Vec<Lost>> {
    let share = |a: u64, b: u64, secs: f64| {
        (secs > 0.0 && b >= a).then(|| ((b - a) as f64 / 1e9 / secs * 100.0).min(100.0))
    };
    let mut out = vec![vec![Lost::default(); vcpus.len()]];
    for w in points.windows(2) {
        let secs = w[1].time_s - w[0].time_s;
        out.push(
            vcpus
                .iter()
                .map(|&i| match (w[0].vcpus.get(i), w[1].vcpus.get(i)) {
                    (Some(a), Some(b)) => Lost {
                        stall: share(a.stall_ns, b.stall_ns, secs),
                        throttled: share(a.throttled_ns, b.throttled_ns, secs),
                    },
                    _ => Lost::default(),
                })
                .collect(),
        );
    }
    out.truncate(points.len());
    out
}

/// The largest finite guest progress rate of the vCPUs shown, 0 if none.
fn max_progress(points: &[&Point], vcpus: &[usize]) -> f64 {
    points
        .iter()
        .flat_map(|p| vcpus.iter().filter_map(|&i| p.vcpus.get(i)))
        .map(|v| v.progress_per_s)
        .filter(|r| r.is_finite())
        .fold(0.0, f64::max)
}

/// The largest finite rate of the vCPUs shown, 0 if none.
fn max_rate(points: &[&Point], vcpus: &[usize]) -> f64 {
    let rates = points
        .iter()
        .flat_map(|p| vcpus.iter().filter_map(|&i| p.vcpus.get(i)));
    rates
        .flat_map(|v| [v.exits_per_s, v.our_exits_per_s])
        .filter(|r| r.is_finite())
        .fold(0.0, f64::max)
}

/// `text` with the characters XML cannot carry (control characters, and
/// U+FFFE and U+FFFF, which browsers refuse an SVG for) replaced.
pub(super) fn clean(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{FFFE}' | '\u{FFFF}') {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

/// `text` cut to `max` characters, with an ellipsis when cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per column of pixels, a path keeps the way in, its top and bottom
    /// and the way out, in order; a column of one or two points keeps them.
    #[test]
    fn a_path_keeps_four_points_a_pixel_column_at_most() {
        let px = [
            (0, 5),
            (1, 5),
            (1, 9),
            (1, 1),
            (1, 4),
            (1, 6),
            (2, 3),
            (2, 3),
            (3, 0),
        ];
        assert_eq!(column_extremes(&px), [0, 1, 2, 3, 5, 6, 7, 8]);
        let flat: Vec<(i32, i32)> = (0..10_000).map(|i| (i / 1000, i % 7)).collect();
        let kept = column_extremes(&flat);
        assert!(kept.len() <= 40, "{}", kept.len());
        for column in 0..10 {
            let ys: Vec<i32> = kept
                .iter()
                .filter(|&&k| flat[k].0 == column)
                .map(|&k| flat[k].1)
                .collect();
            assert_eq!(ys.iter().min(), Some(&0), "column {column}: {ys:?}");
            assert_eq!(ys.iter().max(), Some(&6), "column {column}: {ys:?}");
        }
        assert!(column_extremes(&[]).is_empty());
    }

    #[test]
    fn lost_shares_are_per_interval_and_skip_counts_that_went_down() {
        let at = |t: f64, stall_ms: u64, slept_ms: u64| Point {
            seq: 0,
            time_s: t,
            pages_4k: 0,
            pages_2m: 0,
            pages_1g: 0,
            vcpus: vec![VcpuPoint {
                stall_ns: stall_ms * 1_000_000,
                throttled_ns: slept_ms * 1_000_000,
                ..VcpuPoint::default()
            }],
        };
        // 0.1 s apart: 5 ms stalled and 50 ms asleep, then a restart (a
        // migration's destination counts from 0), then 100 % capped.
        let points = [
            at(0.0, 0, 0),
            at(0.1, 5, 50),
            at(0.2, 0, 0),
            at(0.3, 500, 0),
        ];
        let refs: Vec<&Point> = points.iter().collect();
        let l = lost_shares(&refs, &[0]);
        assert_eq!(l.len(), 4);
        assert_eq!(l[0][0], Lost::default());
        assert!(l[1][0].stall.is_some_and(|s| (s - 5.0).abs() < 1e-9));
        assert!(l[1][0].throttled.is_some_and(|s| (s - 50.0).abs() < 1e-9));
        assert_eq!(l[2][0], Lost::default(), "counts went down");
        assert_eq!(l[3][0].stall, Some(100.0));
        // A vCPU the series lacks has no share.
        assert_eq!(lost_shares(&refs, &[3])[1][0], Lost::default());
    }

    #[test]
    fn a_wide_line_is_cut_only_where_it_turns_back() {
        // A spike one pixel wide: up, then straight back down.
        assert_eq!(sharp_turns(&[(0, 100), (1, 10), (2, 100), (3, 100)]), [1]);
        // A straight run, a right angle and a gentle bend are drawn whole.
        assert!(sharp_turns(&[(0, 0), (5, 0), (10, 0)]).is_empty());
        assert!(sharp_turns(&[(0, 0), (5, 0), (5, 5)]).is_empty());
        assert!(sharp_turns(&[(0, 0), (5, 1), (10, 5)]).is_empty());
        assert!(sharp_turns(&[(0, 0)]).is_empty());
        // A spike whose tip is several samples on one pixel: cut at its
        // first, and where it comes down (the backend joins them as one).
        assert_eq!(
            sharp_turns(&[(0, 100), (1, 10), (1, 10), (1, 10), (2, 100), (3, 100)]),
            [1]
        );
    }

    #[test]
    fn clean_replaces_control_characters_only() {
        assert_eq!(clean("a\u{7}b <c>"), "a\u{FFFD}b <c>");
        assert_eq!(clean("x\u{FFFE}y\u{FFFF}"), "x\u{FFFD}y\u{FFFD}");
    }

    #[test]
    fn shorten_cuts_with_an_ellipsis() {
        assert_eq!(shorten("abcdef", 4), "abc…");
        assert_eq!(shorten("abc", 4), "abc");
    }

    #[test]
    fn our_rate_is_a_lighter_shade_of_the_vcpus_colour() {
        assert_eq!(rate_color(0, Rate::Kvm), RGBColor(0x4e, 0x79, 0xa7));
        assert_eq!(rate_color(10, Rate::Ours), RGBColor(0xa6, 0xbc, 0xd3));
    }
}
