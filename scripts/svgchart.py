"""Small SVG charts for the experiment scripts, standard library only.

Two kinds, enough for docs/EXPERIMENTS.md: a line (or point) chart with linear
or log axes, and a grouped bar chart. Each has a title, labelled axes with
round ticks, light grid lines, an optional shaded band and reference lines, and
a legend to the right of the plot area (so it never covers data).

    line_chart("cost.svg", "Cost vs guest size", "guest RAM", "time (us)",
               [Series("scan", [(256, 900), (1024, 950)])], xlog=True, ylog=True)
"""

import math
from xml.sax.saxutils import escape

# Okabe-Ito (distinguishable with the common colour-vision deficiencies), its
# yellow dropped for being faint on white, then three of Paul Tol's muted colours.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#882255", "#999933",
           "#44AA99"]
MARKERS = ["circle", "square", "triangle", "diamond"]
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'


class Series:
    """One line (or set of points, or bars): a name and its data."""

    def __init__(self, name, points, dashed=False, lines=True, color=None, opacity=1.0):
        self.name, self.points, self.dashed, self.lines, self.color = name, points, dashed, lines, color
        self.opacity = opacity


def compact(v):
    """A short label for a tick value: 0.5, 20, 1.5k, 2M, 1e-3."""
    if v == 0:
        return "0"
    a = abs(v)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return ("%g" % round(v / div, 3)) + suffix
    if a < 0.01:
        return "%.0e" % v
    return "%g" % round(v, 4)


def bytes_label(v):
    """A binary-size label: 256M, 1G, 16G."""
    for div, suffix in ((1 << 40, "T"), (1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if v >= div:
            return ("%g" % round(v / div, 2)) + suffix
    return "%d" % v


class Axis:
    """Maps data values to pixels along one axis, linear or log10."""

    def __init__(self, lo, hi, log, pix_lo, pix_hi, zero=True, base2=False):
        self.base2 = base2
        if log:
            lo, hi = max(lo, 1e-12), max(hi, 1e-12)
            b = 2 if base2 else 10
            lo, hi = b ** math.floor(math.log(lo, b) + 1e-9), b ** math.ceil(math.log(hi, b) - 1e-9)
            if lo == hi:
                lo, hi = lo / b, hi * b
        else:
            if zero:
                lo = min(lo, 0.0)
                if lo < 0 and -lo < 0.02 * (hi - lo):  # a sliver below zero: keep the axis at 0
                    lo = 0.0
            if lo == hi:
                lo, hi = lo - 1, hi + 1
            step = nice_step((hi - lo) / 6)
            lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
        self.lo, self.hi, self.log, self.p0, self.p1 = lo, hi, log, pix_lo, pix_hi

    def __call__(self, v):
        if self.log:
            v = max(v, self.lo)
            f = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            f = (max(v, self.lo) - self.lo) / (self.hi - self.lo)
        return self.p0 + f * (self.p1 - self.p0)

    def ticks(self):
        if self.log and self.base2:
            exps = range(round(math.log2(self.lo)), round(math.log2(self.hi)) + 1)
            step = max(1, math.ceil(len(exps) / 8))
            return [2.0**e for e in exps if (exps[-1] - e) % step == 0]
        if self.log:
            decades = range(round(math.log10(self.lo)), round(math.log10(self.hi)) + 1)
            step = max(1, math.ceil(len(decades) / 8))
            major = [10.0**d for d in decades if (d - decades[0]) % step == 0]
            if len(decades) <= 3:  # few decades: 2 and 5 as well
                major = sorted(set(major + [m * 10.0**d for d in decades for m in (2, 5) if m * 10.0**d <= self.hi]))
            return major
        step = nice_step((self.hi - self.lo) / 6)
        n = round((self.hi - self.lo) / step)
        return [self.lo + i * step for i in range(n + 1)]


def nice_step(raw):
    """The round step (1, 2 or 5 times a power of ten) nearest above `raw`."""
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


class Canvas:
    """An SVG document being written: a title, a plot area and a legend column."""

    def __init__(self, width, height, title, legend_names):
        self.w, self.h, self.out = width, height, []
        legend_w = max((len(n) for n in legend_names), default=0) * 7 + 44 if legend_names else 0
        self.left, self.right, self.top, self.bottom = 78, width - 20 - legend_w, 46, height - 58
        self.add('<rect width="%d" height="%d" fill="white"/>' % (width, height))
        self.text(width / 2, 26, title, size=16, anchor="middle", weight="bold")

    def add(self, s):
        self.out.append(s)

    def text(self, x, y, s, size=12, anchor="start", weight="normal", rotate=None, color="#222"):
        rot = ' transform="rotate(%d %.1f %.1f)"' % (rotate, x, y) if rotate else ""
        self.add('<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" font-weight="%s" fill="%s" %s%s>%s</text>'
                 % (x, y, size, anchor, weight, color, FONT, rot, escape(str(s))))

    def line(self, x1, y1, x2, y2, color="#888", width=1.0, dash=None):
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        self.add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"%s/>' % (x1, y1, x2, y2, color, width, d))

    def marker(self, kind, x, y, color, r=4.0):
        if kind == "circle":
            self.add('<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"/>' % (x, y, r, color))
        elif kind == "square":
            self.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>' % (x - r, y - r, 2 * r, 2 * r, color))
        elif kind == "triangle":
            self.add('<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>' % (x, y - r - 1, x - r - 1, y + r, x + r + 1, y + r, color))
        else:
            self.add('<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>' % (x, y - r - 1, x + r + 1, y, x, y + r + 1, x - r - 1, y, color))

    def axes(self, xlabel, ylabel):
        self.add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
                 % (self.left, self.top, self.right - self.left, self.bottom - self.top))
        self.text((self.left + self.right) / 2, self.h - 14, xlabel, size=13, anchor="middle")
        self.text(18, (self.top + self.bottom) / 2, ylabel, size=13, anchor="middle", rotate=-90)

    def y_ticks(self, ax, fmt):
        for v in ax.ticks():
            y = ax(v)
            self.line(self.left, y, self.right, y, color="#e4e4e4")
            self.line(self.left - 4, y, self.left, y, color="#444")
            self.text(self.left - 7, y + 4, fmt(v), size=11, anchor="end")

    def band(self, ax, lo, hi, label):
        y1, y2 = ax(hi), ax(lo)
        self.add('<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="#2ca02c" fill-opacity="0.12"/>'
                 % (self.left, y1, self.right - self.left, max(y2 - y1, 1)))
        if label:
            self.text(self.left + 6, y1 + 13, label, size=11, color="#2a6e2a")

    def hline(self, ax, v, label):
        y = ax(v)
        self.line(self.left, y, self.right, y, color="#555", dash="6,4")
        if label:
            self.text(self.left + 6, y - 5, label, size=11, color="#555")

    def legend(self, entries):
        """entries: (name, color, marker or None for a bar swatch, dashed, opacity)."""
        x, y = self.right + 16, self.top + 6
        for i, (name, color, marker, dashed, opacity) in enumerate(entries):
            cy = y + i * 20 + 8
            if marker is None:
                self.add('<rect x="%.1f" y="%.1f" width="16" height="11" fill="%s" fill-opacity="%.2f"/>'
                         % (x, cy - 6, color, opacity))
            else:
                if dashed is not None:  # None: a marker alone
                    self.line(x - 2, cy, x + 18, cy, color=color, width=2, dash="5,3" if dashed else None)
                self.marker(marker, x + 8, cy, color, r=3.5)
            self.text(x + 24, cy + 4, name, size=12)

    def save(self, path):
        with open(path, "w") as f:
            f.write('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">\n' % (self.w, self.h, self.w, self.h))
            f.write("\n".join(self.out))
            f.write("\n</svg>\n")


def line_chart(path, title, xlabel, ylabel, series, xlog=False, ylog=False, xticks=None, yfmt=compact,
               band=None, hlines=(), width=900, height=500, ylim=None, ybase2=False):
    """Writes a line/point chart. `xticks`: [(value, label)] instead of automatic
    ticks; `band`: (lo, hi, label) shaded; `hlines`: [(y, label)] dashed lines;
    `ylim`: (lo, hi) to include in the y range; `ybase2`: log ticks at powers of 2."""
    pts = [p for s in series for p in s.points if p[1] is not None and (not ylog or p[1] > 0)]
    if not pts:
        return
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    ys += [v for v, _ in hlines] + ([band[0], band[1]] if band else []) + (list(ylim) if ylim else [])
    if xticks:
        xs += [v for v, _ in xticks]
    c = Canvas(width, height, title, [s.name for s in series])
    ax = Axis(min(xs), max(xs), xlog, c.left + 14, c.right - 14, zero=False)
    if xlog and xticks:  # keep the data's own range, not whole decades
        ax.lo, ax.hi = min(xs), max(xs)
    ay = Axis(min(ys), max(ys), ylog, c.bottom, c.top, base2=ybase2)
    c.y_ticks(ay, yfmt)
    if band:
        c.band(ay, *band)
    for v, label in xticks or [(v, compact(v)) for v in ax.ticks()]:
        x = ax(v)
        c.line(x, c.top, x, c.bottom, color="#efefef")
        c.line(x, c.bottom, x, c.bottom + 4, color="#444")
        c.text(x, c.bottom + 18, label, size=11, anchor="middle")
    for v, label in hlines:
        c.hline(ay, v, label)
    entries = []
    for i, s in enumerate(series):
        color, marker = s.color or PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]
        good = sorted((p for p in s.points if p[1] is not None and (not ylog or p[1] > 0)), key=lambda p: p[0])
        if s.lines and len(good) > 1:
            d = " ".join("%s%.1f,%.1f" % ("M" if j == 0 else "L", ax(x), ay(y)) for j, (x, y) in enumerate(good))
            dash = ' stroke-dasharray="6,4"' if s.dashed else ""
            c.add('<path d="%s" fill="none" stroke="%s" stroke-width="2"%s/>' % (d, color, dash))
        for x, y in good:
            c.marker(marker, ax(x), ay(y), color)
        entries.append((s.name, color, marker, s.dashed, 1.0))
    c.axes(xlabel, ylabel)
    c.legend(entries)
    c.save(path)


def bar_chart(path, title, ylabel, groups, series, ylog=False, yfmt=compact, band=None, hlines=(),
              width=900, height=500, xlabel="", dots=False):
    """Writes a grouped bar chart: one cluster per group, one bar per series
    (`Series.points` holds one value per group; None leaves a gap). With `dots`,
    each value is a marker instead of a bar and the y axis fits the data rather
    than starting at zero (for ratios near 1)."""
    vals = [v for s in series for v in s.points if v is not None and (not ylog or v > 0)]
    if not vals:
        return
    vals += [v for v, _ in hlines] + ([band[0], band[1]] if band else [])
    c = Canvas(width, height, title, [s.name for s in series] if len(series) > 1 else [])
    lines = max(str(g).count("\n") + 1 for g in groups)
    c.bottom -= 13 * (lines - 1)
    ay = Axis(min(vals), max(vals), ylog, c.bottom, c.top, zero=not dots)
    c.y_ticks(ay, yfmt)
    if band:
        c.band(ay, *band)
    slot = (c.right - c.left) / max(len(groups), 1)
    bar = slot * 0.8 / max(len(series), 1)
    base = ay(ay.lo) if ylog else ay(max(ay.lo, 0))
    for g, name in enumerate(groups):
        gx = c.left + g * slot
        if g:
            c.line(gx, c.top, gx, c.bottom, color="#f0f0f0")
        for k, part in enumerate(str(name).split("\n")):
            c.text(gx + slot / 2, c.bottom + 16 + 13 * k, part, size=11, anchor="middle")
        for i, s in enumerate(series):
            v = s.points[g] if g < len(s.points) else None
            if v is None or (ylog and v <= 0):
                continue
            x, y, color = gx + slot * 0.1 + i * bar, ay(v), s.color or PALETTE[i % len(PALETTE)]
            if dots:
                c.marker(MARKERS[i % len(MARKERS)], x + bar / 2, y, color, r=5)
            else:
                c.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="%.2f"/>'
                      % (x, min(y, base), max(bar - 2, 1), abs(base - y), color, s.opacity))
    for v, label in hlines:
        c.hline(ay, v, label)
    c.axes(xlabel, ylabel)
    if len(series) > 1:
        c.legend([(s.name, s.color or PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)] if dots else None, None,
                   s.opacity) for i, s in enumerate(series)])
    c.save(path)
