"""The experiment charts, drawn with matplotlib (pip `matplotlib`, or Debian's
`python3-matplotlib`; `.ci/run` installs it).

Two kinds, enough for docs/EXPERIMENTS.md: a line (or point) chart with linear
or log axes, and a grouped bar (or dot) chart, each with an optional shaded band
and dashed reference lines, and the legend right of the plot area so that it
never covers data. Output is SVG with its text kept as text.

    line_chart("cost.svg", "Cost vs guest size", "guest RAM", "time (us)",
               [Series("scan", [(256, 900), (1024, 950)])], xlog=True, ylog=True)
"""

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
except ImportError as e:  # pragma: no cover - depends on the machine
    raise SystemExit("the experiment charts need matplotlib: `python3 -m pip install matplotlib` "
                     "or `apt-get install python3-matplotlib` (%s)" % e)

# Okabe-Ito (distinguishable with the common colour-vision deficiencies), its
# yellow dropped for being faint on white, then three of Paul Tol's muted colours.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#882255", "#999933",
           "#44AA99"]
MARKERS = ["o", "s", "^", "D"]
DPI = 100

plt.rcParams.update({
    "svg.fonttype": "none",  # text stays text: smaller files, searchable
    "svg.hashsalt": "kvmscope",  # the same data gives the same file
    "font.family": ["DejaVu Sans", "sans-serif"],
    "font.size": 10,
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "axes.axisbelow": True,
})


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


def _figure(title, width, height):
    fig, ax = plt.subplots(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    # Over the whole figure, legend included, so that a long title fits.
    fig.suptitle(title, fontweight="bold")
    return fig, ax


def _references(ax, band, hlines):
    if band:
        lo, hi, label = band
        ax.axhspan(lo, hi, color="#2ca02c", alpha=0.12, lw=0)
        if label:
            ax.annotate(label, (0.01, hi), xycoords=("axes fraction", "data"), va="top", color="#2a6e2a")
    for v, label in hlines:
        ax.axhline(v, color="#555", lw=1, ls=(0, (6, 4)))
        if label:
            ax.annotate(label, (0.01, v), xycoords=("axes fraction", "data"), va="bottom", color="#555")


def _save(fig, ax, path, xlabel, ylabel, yfmt, legend):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ax.get_yscale() == "linear":
        ax.yaxis.set_major_locator(ticker.MaxNLocator(steps=[1, 2, 5, 10]))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: yfmt(v)))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def line_chart(path, title, xlabel, ylabel, series, xlog=False, ylog=False, xticks=None, yfmt=compact,
               band=None, hlines=(), width=900, height=500, ybase2=False):
    """Writes a line/point chart. `xticks`: [(value, label)] instead of automatic
    ticks; `band`: (lo, hi, label) shaded; `hlines`: [(y, label)] dashed lines;
    `ybase2`: log ticks at powers of 2. Points with no y (or none > 0 on a log
    axis) are left out; nothing is written if no point is left."""
    usable = lambda p: p[1] is not None and (not ylog or p[1] > 0)  # noqa: E731
    if not any(usable(p) for s in series for p in s.points):
        return
    fig, ax = _figure(title, width, height)
    if xlog:
        ax.set_xscale("log")
    if ylog:
        ax.set_yscale("log", base=2 if ybase2 else 10)
    for i, s in enumerate(series):
        good = sorted((p for p in s.points if usable(p)), key=lambda p: p[0])
        if not good:
            continue
        ax.plot([x for x, _ in good], [y for _, y in good], color=s.color or PALETTE[i % len(PALETTE)],
                marker=MARKERS[i % len(MARKERS)], markersize=5, lw=2 if s.lines else 0,
                ls="--" if s.dashed else "-", label=s.name)
    if xticks:
        ax.xaxis.set_major_locator(ticker.FixedLocator([v for v, _ in xticks]))
        ax.xaxis.set_major_formatter(ticker.FixedFormatter([label for _, label in xticks]))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
    else:
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: compact(v)))
    _references(ax, band, hlines)
    _save(fig, ax, path, xlabel, ylabel, yfmt, legend=True)


def bar_chart(path, title, ylabel, groups, series, ylog=False, yfmt=compact, band=None, hlines=(),
              width=900, height=500, xlabel="", dots=False):
    """Writes a grouped bar chart: one cluster per group, one bar per series
    (`Series.points` holds one value per group; None leaves a gap). With `dots`,
    each value is a marker instead of a bar and the y axis fits the data rather
    than starting at zero (for ratios near 1)."""
    usable = lambda v: v is not None and (not ylog or v > 0)  # noqa: E731
    if not any(usable(v) for s in series for v in s.points):
        return
    fig, ax = _figure(title, width, height)
    if ylog:
        ax.set_yscale("log")
    bar = 0.8 / max(len(series), 1)
    for i, s in enumerate(series):
        at = [(g + (i - (len(series) - 1) / 2) * bar, v) for g, v in enumerate(s.points[:len(groups)]) if usable(v)]
        xs, ys = [x for x, _ in at], [v for _, v in at]
        color = s.color or PALETTE[i % len(PALETTE)]
        if dots:
            ax.plot(xs, ys, ls="none", marker=MARKERS[i % len(MARKERS)], markersize=7, color=color, label=s.name)
        else:
            ax.bar(xs, ys, width=bar * 0.95, color=color, alpha=s.opacity, label=s.name)
    ax.set_xticks(range(len(groups)), [str(g) for g in groups])
    ax.xaxis.grid(False)
    _references(ax, band, hlines)
    _save(fig, ax, path, xlabel, ylabel, yfmt, legend=len(series) > 1)
