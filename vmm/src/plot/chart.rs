//! Lays the chart out: two panels sharing the time axis (mapped bytes by page
//! size above, exit rates per vCPU below), phase markers across both, and a
//! legend in the right margin.

use std::fmt::Write;

use super::markers::{self, PhaseChange};
use super::scale::{self, Axis};
use super::svg::{circle, coords, line, num, rect, El, Rect, Svg};
use super::{ChartOptions, PlotError, RateScale, Rendered, MAX_SIDE, MIN_HEIGHT, MIN_WIDTH};
use crate::sampler::record::{Point, SeriesHeader, VcpuPoint};
use crate::units::format_bytes;

const LEFT: f64 = 84.0;
const RIGHT: f64 = 215.0;
const TOP: f64 = 64.0;
const BOTTOM: f64 = 52.0;
const GAP: f64 = 26.0;
/// Phase changes closer than this share one marker line.
const MARKER_MIN_PX: f64 = 13.0;
/// Rough width of one character of an 11 px label, to cut labels that would not fit.
const LABEL_CHAR_PX: f64 = 6.4;
pub(super) const ROW: f64 = 18.0;

/// One colour per vCPU (Tableau 10), repeating after ten.
pub(super) const VCPU_COLORS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Page-size layers, bottom to top: legend name, SVG id, fill, bytes per page.
pub(super) const LAYERS: [(&str, &str, &str, f64); 3] = [
    ("4 KiB pages", "layer-4k", "#9ecae1", 4096.0),
    ("2 MiB pages", "layer-2m", "#fdae6b", 2_097_152.0),
    ("1 GiB pages", "layer-1g", "#a1d99b", 1_073_741_824.0),
];

/// Bytes mapped with one page size. In floating point, so no count can overflow.
fn layer_bytes(p: &Point, layer: usize) -> f64 {
    let pages = [p.pages_4k, p.pages_2m, p.pages_1g];
    pages[layer] as f64 * LAYERS[layer].3
}

fn total_bytes(p: &Point) -> f64 {
    (0..LAYERS.len()).map(|k| layer_bytes(p, k)).sum()
}

/// Checks the chart size before anything is read.
///
/// # Errors
/// `PlotError::BadSize` outside `MIN_WIDTH`/`MIN_HEIGHT` to `MAX_SIDE`.
pub fn check_size(opts: &ChartOptions) -> Result<(), PlotError> {
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

/// Which of a vCPU's two rates a line shows.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rate {
    /// KVM's `exits` stat: every exit, handled in the kernel or not.
    Kvm,
    /// Exits that reached this VMM.
    Ours,
}

impl Rate {
    fn of(self, v: &VcpuPoint) -> f64 {
        match self {
            Rate::Kvm => v.exits_per_s,
            Rate::Ours => v.our_exits_per_s,
        }
    }

    fn id(self) -> &'static str {
        match self {
            Rate::Kvm => "kvm",
            Rate::Ours => "ours",
        }
    }

    pub(super) fn style(self, el: El) -> El {
        match self {
            Rate::Kvm => el.num("stroke-width", 1.8),
            Rate::Ours => el.num("stroke-width", 1.4).attr("stroke-dasharray", "6 3"),
        }
    }
}

/// A series ready to draw: samples with a finite time, the vCPUs shown, and
/// the layout and axes derived from them.
pub struct Chart<'a> {
    opts: &'a ChartOptions,
    header: &'a SeriesHeader,
    points: Vec<&'a Point>,
    pub(super) vcpus: Vec<usize>,
    /// vCPUs in the series, shown or not.
    available: usize,
    pub(super) layers: [bool; 3],
    /// Seconds from the first sample to the last.
    span_s: f64,
    changes: Vec<PhaseChange>,
    pub(super) top: Rect,
    pub(super) bottom: Rect,
    time: Axis,
    bytes: Axis,
    rates: Axis,
}

impl<'a> Chart<'a> {
    /// Validates the options against the series and lays the chart out.
    ///
    /// # Errors
    /// A bad size, no sample with a finite time, or a `vcpu` the series lacks.
    pub fn new(
        header: &'a SeriesHeader,
        points: &'a [Point],
        opts: &'a ChartOptions,
    ) -> Result<Self, PlotError> {
        check_size(opts)?;
        let points: Vec<&Point> = points.iter().filter(|p| p.time_s.is_finite()).collect();
        let (Some(first), Some(last)) = (points.first(), points.last()) else {
            return Err(PlotError::EmptySeries {
                name: opts.source.clone(),
            });
        };
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
        let t0 = points.iter().map(|p| p.time_s).fold(first.time_s, f64::min);
        let t1 = points.iter().map(|p| p.time_s).fold(last.time_s, f64::max);
        let max_bytes = points.iter().map(|p| total_bytes(p)).fold(0.0, f64::max);
        let max_rate = max_rate(&points, &vcpus);
        let (w, h) = (f64::from(opts.width), f64::from(opts.height));
        let panel_h = (h - TOP - BOTTOM - GAP) / 2.0;
        let top = Rect {
            x: LEFT,
            y: TOP,
            w: w - LEFT - RIGHT,
            h: panel_h,
        };
        Ok(Chart {
            opts,
            header,
            layers: [0, 1, 2].map(|k| points.iter().any(|p| layer_bytes(p, k) > 0.0)),
            changes: markers::phase_changes(&points, &vcpus),
            points,
            vcpus,
            available,
            span_s: t1 - t0,
            top,
            bottom: Rect {
                y: top.bottom() + GAP,
                ..top
            },
            time: scale::time_axis(t0, t1),
            bytes: scale::bytes_axis(max_bytes),
            rates: match opts.rates {
                RateScale::Log => scale::log_rate_axis(max_rate),
                RateScale::Linear => scale::linear_rate_axis(max_rate),
            },
        })
    }

    /// Writes the chart as an SVG document.
    pub fn render(&self) -> Rendered {
        let mut svg = Svg::new(self.opts.width, self.opts.height);
        svg.leaf(
            El::new("rect")
                .attr("width", "100%")
                .attr("height", "100%")
                .attr("fill", "white"),
        );
        self.draw_title(&mut svg);
        for panel in [self.top, self.bottom] {
            svg.leaf(
                rect(panel)
                    .attr("fill", "#fcfcfc")
                    .attr("stroke", "#c8c8c8"),
            );
        }
        self.draw_bands(&mut svg);
        self.draw_axes(&mut svg);
        self.draw_bytes(&mut svg);
        self.draw_rates(&mut svg);
        let markers = self.draw_markers(&mut svg);
        self.draw_legend(&mut svg);
        Rendered {
            svg: svg.finish(),
            points: self.points.len(),
            markers,
            vcpus: self.vcpus.len(),
        }
    }

    fn x(&self, t: f64) -> f64 {
        self.top.x + self.time.frac(t) * self.top.w
    }

    fn y_bytes(&self, b: f64) -> f64 {
        self.top.bottom() - self.bytes.frac(b) * self.top.h
    }

    fn y_rate(&self, r: f64) -> f64 {
        self.bottom.bottom() - self.rates.frac(r) * self.bottom.h
    }

    fn draw_title(&self, svg: &mut Svg) {
        let title = self.opts.title.as_deref().unwrap_or(&self.opts.source);
        let el = El::new("text")
            .attr("id", "title")
            .num("x", LEFT)
            .num("y", 26.0);
        svg.text(el.attr("font-size", 17).attr("font-weight", "bold"), title);
        let el = El::new("text")
            .attr("id", "subtitle")
            .num("x", LEFT)
            .num("y", 46.0);
        svg.text(el.attr("fill", "#555"), &self.subtitle());
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
            parts.push(b.to_string());
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
            parts.push(format!("sampled every {} ms", scale::si(h.interval_ms)));
        }
        parts.push(format!(
            "{} samples over {:.2} s",
            self.points.len(),
            self.span_s
        ));
        parts.join("  ·  ")
    }

    /// With one vCPU shown, a faint band per phase, coloured by its command.
    fn draw_bands(&self, svg: &mut Svg) {
        if self.vcpus.len() != 1 || self.changes.is_empty() {
            return;
        }
        svg.open(
            El::new("g")
                .attr("id", "bands")
                .attr("fill-opacity", "0.07"),
        );
        for (i, c) in self.changes.iter().enumerate() {
            let x0 = self.x(c.time_s);
            let x1 = self
                .changes
                .get(i + 1)
                .map_or(self.top.right(), |n| self.x(n.time_s));
            for panel in [self.top, self.bottom] {
                let band = Rect {
                    x: x0,
                    w: x1 - x0,
                    ..panel
                };
                svg.leaf(rect(band).attr("fill", markers::command_color(c.code)));
            }
        }
        svg.close();
    }

    fn draw_axes(&self, svg: &mut Svg) {
        svg.open(El::new("g").attr("id", "axes").attr("fill", "#333"));
        for tick in &self.time.ticks {
            let x = self.x(tick.value);
            for panel in [self.top, self.bottom] {
                svg.leaf(line(x, panel.y, x, panel.bottom()).attr("stroke", "#e4e4e4"));
            }
            let label = El::new("text")
                .num("x", x)
                .num("y", self.bottom.bottom() + 17.0);
            svg.text(label.attr("text-anchor", "middle"), &tick.label);
        }
        let mid = self.top.x + self.top.w / 2.0;
        let title = El::new("text")
            .num("x", mid)
            .num("y", self.bottom.bottom() + 38.0);
        svg.text(title.attr("text-anchor", "middle"), "time (s)");
        y_axis(
            svg,
            self.top,
            &self.bytes,
            |b| self.y_bytes(b),
            "mapped guest memory",
        );
        let rate_title = match self.opts.rates {
            RateScale::Log => "exits/s (log scale)",
            RateScale::Linear => "exits/s",
        };
        y_axis(
            svg,
            self.bottom,
            &self.rates,
            |r| self.y_rate(r),
            rate_title,
        );
        svg.close();
    }

    /// Stacked areas per page size, and the total as a line on top.
    fn draw_bytes(&self, svg: &mut Svg) {
        svg.open(El::new("g").attr("id", "bytes"));
        let mut below = vec![0.0; self.points.len()];
        for (k, (_, id, fill, _)) in LAYERS.iter().enumerate() {
            if !self.layers[k] {
                continue;
            }
            let above: Vec<f64> = below
                .iter()
                .zip(&self.points)
                .map(|(b, p)| b + layer_bytes(p, k))
                .collect();
            let upper = self
                .points
                .iter()
                .zip(&above)
                .map(|(p, b)| (self.x(p.time_s), self.y_bytes(*b)));
            let lower = self
                .points
                .iter()
                .zip(&below)
                .rev()
                .map(|(p, b)| (self.x(p.time_s), self.y_bytes(*b)));
            svg.leaf(
                El::new("polygon")
                    .attr("id", *id)
                    .attr("points", coords(upper.chain(lower)))
                    .attr("fill", *fill),
            );
            below = above;
        }
        let total: Vec<(f64, f64)> = self
            .points
            .iter()
            .map(|p| (self.x(p.time_s), self.y_bytes(total_bytes(p))))
            .collect();
        let el = El::new("polyline")
            .attr("id", "total-mapped")
            .attr("points", coords(total.iter().copied()));
        svg.leaf(
            el.attr("fill", "none")
                .attr("stroke", "#222")
                .num("stroke-width", 1.8)
                .attr("stroke-linejoin", "round"),
        );
        if let [(x, y)] = total[..] {
            svg.leaf(circle(x, y).attr("fill", "#222"));
        }
        svg.close();
    }

    /// Per vCPU, KVM's exit rate as a solid line and ours dashed, in the vCPU's colour.
    fn draw_rates(&self, svg: &mut Svg) {
        svg.open(
            El::new("g")
                .attr("id", "rates")
                .attr("fill", "none")
                .attr("stroke-linejoin", "round"),
        );
        for &vcpu in &self.vcpus {
            let color = VCPU_COLORS[vcpu % VCPU_COLORS.len()];
            for rate in [Rate::Kvm, Rate::Ours] {
                let (d, dots) = self.rate_path(vcpu, rate);
                if d.is_empty() {
                    continue;
                }
                let el = El::new("path")
                    .attr("id", format!("rate-{}-v{vcpu}", rate.id()))
                    .attr("d", d);
                svg.leaf(rate.style(el.attr("stroke", color)));
                if let [(x, y)] = dots[..] {
                    svg.leaf(circle(x, y).attr("fill", color));
                }
            }
        }
        svg.close();
    }

    /// The path of one rate line, lifting the pen over samples that lack the
    /// vCPU or whose rate is NaN or infinite; also the points drawn.
    fn rate_path(&self, vcpu: usize, rate: Rate) -> (String, Vec<(f64, f64)>) {
        let mut d = String::new();
        let mut drawn = Vec::new();
        let mut pen_down = false;
        for p in &self.points {
            match p
                .vcpus
                .get(vcpu)
                .map(|v| rate.of(v))
                .filter(|r| r.is_finite())
            {
                Some(r) => {
                    let (x, y) = (self.x(p.time_s), self.y_rate(r));
                    let _ = write!(
                        d,
                        "{}{},{} ",
                        if pen_down { 'L' } else { 'M' },
                        num(x),
                        num(y)
                    );
                    drawn.push((x, y));
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        (d.trim_end().to_string(), drawn)
    }

    /// A dashed line per phase change (or per cluster of them) across both
    /// panels, labelled along it; returns how many lines it drew.
    fn draw_markers(&self, svg: &mut Svg) -> usize {
        let groups = markers::group(&self.changes, |t| self.x(t), MARKER_MIN_PX);
        let max_chars = ((self.top.h - 10.0) / LABEL_CHAR_PX).max(4.0) as usize;
        svg.open(El::new("g").attr("id", "markers").attr("font-size", 11));
        for g in &groups {
            let (x, color) = (self.x(g.time_s), markers::command_color(g.code));
            svg.open(El::new("g").attr("class", "phase"));
            svg.text(El::new("title"), &g.label);
            let rule = line(x, self.top.y, x, self.bottom.bottom()).attr("stroke", color);
            svg.leaf(
                rule.num("stroke-width", 1.2)
                    .attr("stroke-dasharray", "4 3"),
            );
            // Glyphs sit left of the rule, unless that would run into the y axis.
            let lx = if x - self.top.x < 14.0 {
                x + 12.0
            } else {
                x - 3.0
            };
            let ly = self.top.y + 5.0;
            let label = El::new("text")
                .num("x", lx)
                .num("y", ly)
                .attr("transform", format!("rotate(-90 {} {})", num(lx), num(ly)));
            let label = label
                .attr("text-anchor", "end")
                .attr("fill", color)
                .attr("stroke", "white");
            let label = label
                .num("stroke-width", 3.0)
                .attr("stroke-linejoin", "round")
                .attr("paint-order", "stroke");
            svg.text(label, &shorten(&g.label, max_chars));
            svg.close();
        }
        svg.close();
        groups.len()
    }
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

/// Ticks, grid lines and a rotated title for a panel's value axis.
fn y_axis(svg: &mut Svg, panel: Rect, axis: &Axis, y_of: impl Fn(f64) -> f64, title: &str) {
    for tick in &axis.ticks {
        let y = y_of(tick.value);
        svg.leaf(line(panel.x, y, panel.right(), y).attr("stroke", "#e4e4e4"));
        let label = El::new("text").num("x", panel.x - 6.0).num("y", y + 4.0);
        svg.text(label.attr("text-anchor", "end"), &tick.label);
    }
    let (x, y) = (16.0, panel.y + panel.h / 2.0);
    let el = El::new("text")
        .num("x", x)
        .num("y", y)
        .attr("transform", format!("rotate(-90 {} {})", num(x), num(y)));
    svg.text(
        el.attr("text-anchor", "middle").attr("font-weight", "bold"),
        title,
    );
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
