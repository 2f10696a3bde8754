//! The legend in the right margin: what each colour and line style means,
//! beside the panel it explains. Line samples are thin filled boxes, so the
//! only lines in the image are the data's and the markers'.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::chart::{rate_color, Chart, Drawing, Rate, Rows, INK, LAYERS, TEXT};

/// Height of one legend row, in pixels.
const ROW: i32 = 18;
const SAMPLE_W: i32 = 16;
const GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);
const LIGHT_GREY: RGBColor = RGBColor(0xaa, 0xaa, 0xaa);

impl Chart<'_> {
    /// Draws the legend at `x`, one part beside each panel (`(top, bottom)`
    /// pixel rows of each).
    pub(super) fn draw_legend<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        x: i32,
        rows: &Rows,
    ) -> Drawing<(), DB> {
        let (upper, lower) = (rows.upper, rows.lower);
        if let Some(row) = rows.progress {
            self.draw_progress_legend(root, x, row)?;
        }
        if let Some(row) = rows.lost {
            self.draw_lost_legend(root, x, row)?;
        }
        let mut y = upper.0 + 4;
        self.heading(root, (x, y), "Mapped memory")?;
        for ((name, fill, _), _) in LAYERS
            .iter()
            .zip(self.layers)
            .filter(|(_, present)| *present)
        {
            y += ROW;
            self.entry(root, (x, y), Sample::Box(*fill), name)?;
        }
        y += ROW;
        self.entry(root, (x, y), Sample::Line(INK, 2), "total mapped")?;
        y += ROW;
        self.entry(root, (x, y), Sample::Dashed(GREY), "phase start: v#seq cmd")?;
        if self.vcpus.len() == 1 && y + 2 * ROW <= upper.1 + ROW {
            // The bands: a series has no vCPU state, so a band lasts until
            // the next command starts, whether or not this one has ended.
            y += ROW;
            let band = Sample::Box(RGBColor(0xf2, 0xe4, 0xe4));
            self.entry(root, (x, y), band, "shade: last cmd started")?;
        }
        self.draw_rate_legend(root, x, lower)
    }

    fn draw_rate_legend<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        x: i32,
        (top, bottom): (i32, i32),
    ) -> Drawing<(), DB> {
        let mut y = top + 4;
        self.heading(root, (x, y), "Exit rates")?;
        y += ROW;
        // In grey: each vCPU's colour follows, dark and thick for KVM's count,
        // light and thin for ours.
        self.entry(root, (x, y), Sample::Line(GREY, 2), "KVM exits/s (all)")?;
        y += ROW;
        let ours = Sample::Line(LIGHT_GREY, 1);
        self.entry(root, (x, y), ours, "exits/s that reached us")?;
        let rows = usize::try_from((bottom - y) / ROW).unwrap_or(0).max(1);
        let shown = if self.vcpus.len() > rows {
            rows - 1
        } else {
            self.vcpus.len()
        };
        for &vcpu in &self.vcpus[..shown] {
            y += ROW;
            let color = rate_color(vcpu, Rate::Kvm);
            self.entry(root, (x, y), Sample::Box(color), &format!("vCPU {vcpu}"))?;
        }
        if shown < self.vcpus.len() {
            let more = format!("and {} more vCPUs", self.vcpus.len() - shown);
            root.draw(&Text::new(more, (x, y + ROW), self.font(TEXT, INK)))?;
        }
        Ok(())
    }

    fn draw_progress_legend<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        x: i32,
        (top, _): (i32, i32),
    ) -> Drawing<(), DB> {
        let y = top + 4;
        self.heading(root, (x, y), "Guest progress")?;
        for (i, line) in [
            "its own count per second:",
            "pages touched or read,",
            "page writes (vCPU colours)",
        ]
        .iter()
        .enumerate()
        {
            let at = (x, y + ROW * (1 + i32::try_from(i).unwrap_or(0)));
            root.draw(&Text::new(*line, at, self.font(TEXT, INK)))?;
        }
        Ok(())
    }

    fn draw_lost_legend<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        x: i32,
        (top, _): (i32, i32),
    ) -> Drawing<(), DB> {
        let mut y = top + 4;
        self.heading(root, (x, y), "vCPU time lost")?;
        y += ROW;
        self.entry(root, (x, y), Sample::Line(GREY, 2), "to dirty tracking")?;
        y += ROW;
        let asleep = Sample::Line(LIGHT_GREY, 1);
        self.entry(root, (x, y), asleep, "asleep: throttle, limit")?;
        y += ROW;
        root.draw(&Text::new("(vCPU colours)", (x, y), self.font(TEXT, INK)))?;
        Ok(())
    }

    fn heading<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        at: (i32, i32),
        text: &str,
    ) -> Drawing<(), DB> {
        root.draw(&Text::new(text, at, self.bold(TEXT, INK)))
    }

    /// A sample and its label on the row whose top is `y`.
    fn entry<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        (x, y): (i32, i32),
        sample: Sample,
        text: &str,
    ) -> Drawing<(), DB> {
        let mid = y + 7;
        match sample {
            Sample::Box(fill) => root.draw(&Rectangle::new(
                [(x, y + 2), (x + SAMPLE_W, y + 12)],
                fill.filled(),
            ))?,
            Sample::Line(color, width) => {
                let bar = [
                    (x, mid - width / 2),
                    (x + SAMPLE_W, mid - width / 2 + width),
                ];
                root.draw(&Rectangle::new(bar, color.filled()))?
            }
            Sample::Dashed(color) => {
                for dash in [0, 7, 14] {
                    let bar = [
                        (x + dash, mid),
                        (x + dash + 4.min(SAMPLE_W - dash), mid + 1),
                    ];
                    root.draw(&Rectangle::new(bar, color.filled()))?;
                }
            }
        }
        root.draw(&Text::new(
            text,
            (x + SAMPLE_W + 8, y),
            self.font(TEXT, INK),
        ))
    }
}

/// What a legend row shows before its label.
#[derive(Clone, Copy)]
enum Sample {
    /// A filled box (an area or a vCPU's colour).
    Box(RGBColor),
    /// A solid line of this width.
    Line(RGBColor, i32),
    /// A dashed line (the phase markers).
    Dashed(RGBColor),
}
