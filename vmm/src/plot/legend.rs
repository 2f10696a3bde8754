//! The legend in the right margin: what each colour and line style means,
//! beside the panel it explains.

use super::chart::{Chart, Rate, LAYERS, ROW, VCPU_COLORS};
use super::svg::{line, rect, El, Rect, Svg};

impl Chart<'_> {
    pub(super) fn draw_legend(&self, svg: &mut Svg) {
        let x = self.top.right() + 18.0;
        svg.open(El::new("g").attr("id", "legend").attr("fill", "#222"));
        let mut y = self.top.y + 12.0;
        svg.text(
            El::new("text")
                .num("x", x)
                .num("y", y)
                .attr("font-weight", "bold"),
            "Mapped memory",
        );
        for ((name, _, fill, _), _) in LAYERS
            .iter()
            .zip(self.layers)
            .filter(|(_, present)| *present)
        {
            y += ROW;
            swatch(svg, (x, y), fill, name);
        }
        y += ROW;
        legend_line(
            svg,
            (x, y),
            line(x, y - 4.0, x + 16.0, y - 4.0)
                .attr("stroke", "#222")
                .num("stroke-width", 2.0),
            "total mapped",
        );
        y += ROW;
        let phase = line(x, y - 4.0, x + 16.0, y - 4.0)
            .attr("stroke", "#555")
            .attr("stroke-dasharray", "4 3");
        legend_line(svg, (x, y), phase, "phase start: v#seq cmd");
        self.draw_rate_legend(svg, x);
        svg.close();
    }

    fn draw_rate_legend(&self, svg: &mut Svg, x: f64) {
        let mut y = self.bottom.y + 12.0;
        svg.text(
            El::new("text")
                .num("x", x)
                .num("y", y)
                .attr("font-weight", "bold"),
            "Exit rates",
        );
        for (rate, text) in [
            (Rate::Kvm, "KVM exits/s (all)"),
            (Rate::Ours, "exits/s that reached us"),
        ] {
            y += ROW;
            let el = rate.style(line(x, y - 4.0, x + 16.0, y - 4.0).attr("stroke", "#555"));
            legend_line(svg, (x, y), el, text);
        }
        let rows = ((self.bottom.bottom() - y) / ROW).floor().max(1.0) as usize;
        let shown = if self.vcpus.len() > rows {
            rows - 1
        } else {
            self.vcpus.len()
        };
        for &vcpu in &self.vcpus[..shown] {
            y += ROW;
            let color = VCPU_COLORS[vcpu % VCPU_COLORS.len()];
            swatch(svg, (x, y), color, &format!("vCPU {vcpu}"));
        }
        if shown < self.vcpus.len() {
            let more = format!("and {} more vCPUs", self.vcpus.len() - shown);
            svg.text(El::new("text").num("x", x).num("y", y + ROW), &more);
        }
    }
}

/// A filled box and its label on the row whose baseline is `y`.
fn swatch(svg: &mut Svg, (x, y): (f64, f64), fill: &str, text: &str) {
    let r = Rect {
        x,
        y: y - 9.0,
        w: 16.0,
        h: 10.0,
    };
    svg.leaf(rect(r).attr("fill", fill));
    svg.text(El::new("text").num("x", x + 24.0).num("y", y), text);
}

/// A line sample (`el`) and its label on the row whose baseline is `y`.
fn legend_line(svg: &mut Svg, (x, y): (f64, f64), el: El, text: &str) {
    svg.leaf(el);
    svg.text(El::new("text").num("x", x + 24.0).num("y", y), text);
}
