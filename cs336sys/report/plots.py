"""Line plots for reports: matplotlib with the Agg backend (no display), returned as PNG bytes.

Every plot has labelled axes with units and a legend; an axis goes logarithmic when its
values span more than two decades (seq 128..16384, message sizes 1 KB..1 GB), as in the
latency/bandwidth plots of the FlashAttention and nccl-tests write-ups. Several panels
(one per head dim, say) share one legend and one colour per series, so a line keeps its
colour from panel to panel.

Tick labels are plain text (1024, 16k, 1M), never mathtext: laying out mathtext labels on
log axes cost more than the rest of a 10,000-run report put together (benchmarks/report_speed.py).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from cs336sys.report.kernel_names import cut_apart

Series = dict[str, list[tuple[float, float]]]
_MAX_COLS = 4
_MARKERS = ("o", "s", "^", "D", "v", "P", "<", ">", "*", "h")


@dataclass(frozen=True)
class Plot:
    """A plot to draw: what panel_plot takes. Sections describe their plots; a Drawer
    draws every plot of a report at once (on several cores where it can)."""

    panels: dict[str, Series]
    xlabel: str
    ylabel: str
    title: str
    logx: bool | None = None
    logy: bool | None = None

    @classmethod
    def lines(cls, series: Series, xlabel: str, ylabel: str, title: str, **log) -> Plot:
        """A single panel."""
        return cls({"": series}, xlabel, ylabel, title, **log)

    @property
    def informative(self) -> bool:
        """Some line has two measured x values: a plot of lone points says nothing a table
        does not."""
        return any(len({x for x, y in pts if y is not None}) > 1
                   for series in self.panels.values() for pts in series.values())

    def draw(self) -> bytes:
        return panel_plot(self.panels, self.xlabel, self.ylabel, self.title, self.logx, self.logy)


@dataclass(frozen=True)
class Bar:
    """One bar of a Bars plot: its group (an x label shared by neighbouring bars, e.g. the
    model size) and own label (the precision), the stacked parts (one value per part name,
    None where not measured), the measured total written above the stack, the side panel's
    value and a short note written above the side bar (e.g. the MFU)."""

    group: str
    label: str
    parts: tuple[float | None, ...]
    total: float | None = None
    side: float | None = None
    side_note: str = ""


@dataclass(frozen=True)
class Bars:
    """Stacked bars (the step time split into its phases) beside a second panel of plain
    bars at the same positions (tokens/s, the MFU written above each)."""

    bars: tuple[Bar, ...]
    parts: tuple[str, ...]  # names of the stacked parts, bottom first
    ylabel: str
    side_label: str
    title: str
    side_title: str = ""
    rest: str = "rest of step"  # what the part of the total beyond the stacked parts is
    # Where the parts may add up to more than the total (memory's parts are never all live at
    # once), the total is also a mark across its bar, in the legend by this name.
    total_mark: str = ""

    @property
    def informative(self) -> bool:
        """Two bars or more: one bar says nothing the table does not."""
        return len(self.bars) > 1

    def draw(self) -> bytes:
        return bar_plot(self)


@dataclass(frozen=True)
class Strips:
    """A strip plot of a comparison: per point, every sample of side A on one line and of
    side B just under it (hollow dots, the median a bar), so two distributions that overlap
    or split show as such, not only their medians."""

    points: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...]  # (label, A, B)
    xlabel: str
    title: str
    names: tuple[str, str] = ("A", "B")
    # per point, the (A, B) figures the bars mark where not the samples' medians: what the
    # comparison's table compares (the median of the runs' medians, for a side run twice)
    bars: tuple[tuple[float, float], ...] | None = None

    @property
    def informative(self) -> bool:
        return bool(self.points)

    def draw(self) -> bytes:
        return strip_plot(self)


LEGEND_BELOW_IN = 0.3  # inches under the axis label for a legend "below" it


def strip_plot(plot: Strips) -> bytes:
    """Strips as PNG bytes: one row per point, A above B."""
    import_matplotlib()
    import statistics

    from matplotlib.figure import Figure

    n = len(plot.points)
    fig = Figure(figsize=(7.0, 0.55 * n + 1.3 + LEGEND_BELOW_IN), dpi=100)
    ax = fig.subplots()
    values = [v for _, a, b in plot.points for v in (*a, *b)]
    for i, (_, a, b) in enumerate(plot.points):
        y = n - 1 - i
        bars = plot.bars[i] if plot.bars else (None, None)
        for samples, bar, dy, colour, marker, side in (
                (a, bars[0], 0.15, "C0", "o", plot.names[0]),
                (b, bars[1], -0.15, "C1", "s", plot.names[1])):
            if not samples:
                continue
            ax.plot(samples, [y + dy] * len(samples), linestyle="none", marker=marker,
                    markersize=4, markerfacecolor="none", color=colour,
                    label=side if i == 0 else None)
            ax.plot([statistics.median(samples) if bar is None else bar], [y + dy],
                    linestyle="none", marker="|", markersize=12, markeredgewidth=2,
                    color=colour)
    ax.set_yticks(range(n))
    # settings that differ at the end (seq=32, seq=64) read alike cut at it
    ax.set_yticklabels(cut_apart([label for label, _, _ in reversed(plot.points)], 40),
                       fontsize=7)
    ax.set_ylim(-0.6, n - 0.4)
    # Below the axis: strips fill the whole width, so no corner inside it is free.
    return _value_axis_png(fig, ax, plot.xlabel, plot.title, _spans_decades(values), "below")


def _value_axis_png(fig, ax, xlabel: str, title: str, logx: bool, legend: str) -> bytes:
    """The PNG of a plot whose values run along x (strips, ranked bars): the value axis,
    its grid, the legend (at `legend`, a corner, or "below" the axis) and the title."""
    from matplotlib.ticker import FuncFormatter

    if logx:
        ax.set_xscale("log")
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(short))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    below = 0.0  # the figure's share kept for a legend under the axis label
    if legend == "below":
        # in the figure's bottom strip, not at an offset in axes units: under one point's
        # short axes that offset put the legend over the axis label
        below = LEGEND_BELOW_IN / fig.get_figheight()
        fig.legend(*ax.get_legend_handles_labels(), fontsize=7, frameon=False,
                   loc="lower center", ncol=2)
    else:
        ax.legend(fontsize=7, frameon=False, loc=legend)
    # over the whole figure, not the axes: long tick labels (kernel names) leave the axes
    # narrow, and a title centred on them ran off the image
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, below, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


@dataclass(frozen=True)
class Ranked:
    """Horizontal bars, largest at the top, coloured by group: a profile's top kernels (or
    ops) by total time, one colour per phase."""

    items: tuple[tuple[str, float, str], ...]  # (name, value, group)
    xlabel: str
    title: str
    logx: bool = False  # values that span decades (errors)

    @property
    def informative(self) -> bool:
        return len(self.items) > 1

    def draw(self) -> bytes:
        import_matplotlib()
        from matplotlib.figure import Figure

        items = sorted(self.items, key=lambda t: t[1])  # barh draws bottom up
        groups = list(dict.fromkeys(g for _, _, g in self.items))
        fig = Figure(figsize=(7.0, 0.26 * len(items) + 1.2), dpi=100)
        ax = fig.subplots()
        for group_index, group in enumerate(groups):
            at = [i for i, t in enumerate(items) if t[2] == group]
            ax.barh(at, [items[i][1] for i in at], color=f"C{group_index % 10}", label=group)
        ax.set_yticks(range(len(items)))
        ax.set_yticklabels(cut_apart([n for n, _, _ in items], 52), fontsize=7)
        return _value_axis_png(fig, ax, self.xlabel, self.title, self.logx, "lower right")


def import_matplotlib() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.figure  # loads the font manager and its cache
    from matplotlib import font_manager

    font_manager.fontManager.findfont("DejaVu Sans")


def _span(values: Sequence[float]) -> float:
    """The largest positive value over the smallest (1 where there are none)."""
    pos = [v for v in values if v is not None and v > 0]
    return max(pos) / min(pos) if pos else 1.0


def log_subs(span: float) -> tuple[float, ...]:
    """The labelled ticks of each decade of a log axis whose values span `span` (max/min)
    under two decades: 1, 2 and 5, or every integer under half a decade."""
    return (1.0, 2.0, 5.0) if span > 3 else tuple(float(s) for s in range(1, 10))


def _spans_decades(values: Sequence[float]) -> bool:
    return _span(values) > 100


def short(v: float, _pos: object = None) -> str:
    """A tick label: 512, 16384, 150k, 1.5M, 2G (SI prefixes from 10^5), 0.25."""
    if v == 0:
        return "0"
    if float(v).is_integer() and abs(v) < 1e5:
        return str(int(v))
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    if abs(v) >= 1e5:
        return f"{v / 1e3:.3g}k"
    return f"{v:.4g}"


def line_styles(labels: list[str]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Each series' colour, marker and line style: ten colours, then the next ten with the
    next line style, and the markers shifted by one each round, so that no two series share
    colour and marker (series 0 and 10 did, told apart by a dash alone)."""
    colours = {k: f"C{i % 10}" for i, k in enumerate(labels)}
    markers = {k: _MARKERS[(i + i // 10) % len(_MARKERS)] for i, k in enumerate(labels)}
    styles = {k: ("-", "--", ":", "-.")[(i // 10) % 4] for i, k in enumerate(labels)}
    return colours, markers, styles


def panel_plot(
    panels: dict[str, Series],
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool | None = None,
    logy: bool | None = None,
) -> bytes:
    """One panel per key (its title), side by side, sharing axes scales and one legend."""
    import_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

    all_pts = [p for series in panels.values() for pts in series.values() for p in pts]
    xs, ys = [p[0] for p in all_pts], [p[1] for p in all_pts if p[1] is not None]
    int_x = all(float(x).is_integer() for x in xs)
    # Powers of two (seq 128..65536) read best on a base-2 axis; sizes in bytes on base 10.
    pow2_x = int_x and len(set(xs)) > 1 and all(x > 0 and int(x) & (int(x) - 1) == 0 for x in xs)
    logx = (_spans_decades(xs) or pow2_x) if logx is None else logx
    logy = _spans_decades(ys) if logy is None else logy
    labels = list(dict.fromkeys(k for s in panels.values() for k in s))
    if any(p[1] is None for p in all_pts):
        labels_with_oom = [*labels, "out of memory"]
    else:
        labels_with_oom = labels
    colours, markers, styles = line_styles(labels)

    n = len(panels)
    cols = min(n, _MAX_COLS)
    rows = -(-n // cols)
    # As many legend columns as the longest label lets fit (7-pt text: ~5.3 px a character,
    # ~45 px for the line sample and gaps), at most 3, so no label runs off the figure.
    width_px = 100 * (3.4 * cols + 3.0 * (cols == 1))
    longest = max((len(k) for k in labels), default=1)
    ncol = max(1, min(3, len(labels), int(0.95 * width_px // (5.3 * longest + 45))))
    legend_rows = -(-len(labels_with_oom) // ncol)
    legend_in = 0.17 * legend_rows + 0.15  # inches: one line of 7-pt text per row
    fig = Figure(figsize=(width_px / 100, 3.0 * rows + legend_in),
                 dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    # Series that coincide (triton on sdpa, fp32 on bf16) stay visible: each has its own
    # marker shape, hollow, the first ones largest, so markers drawn later sit inside them.
    sizes = {k: max(3.0, 8.0 - 1.0 * (i % 6)) for i, k in enumerate(labels)}
    oom_drawn = False
    for ax, (name, series) in zip(axes.flat, panels.items(), strict=False):
        for label, pts in series.items():
            measured = sorted(p for p in pts if p[1] is not None)
            ax.plot([p[0] for p in measured], [p[1] for p in measured], marker=markers[label],
                    markersize=sizes[label], markerfacecolor="none", markeredgewidth=1.1,
                    linewidth=1.2, color=colours[label], linestyle=styles[label], label=label)
            failed = [p[0] for p in pts if p[1] is None]
            if failed:  # out of memory: a red cross on the axis at each size that failed
                ax.plot(failed, [0.0] * len(failed), linestyle="none", marker="X",
                        markersize=8, color="#c00000", clip_on=False, zorder=5,
                        transform=ax.get_xaxis_transform(),
                        label=None if oom_drawn else "out of memory")
                oom_drawn = True
        if name:
            ax.set_title(name, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    ax0 = axes.flat[0]
    if logx:
        ax0.set_xscale("log", base=2 if pow2_x else 10)
    elif int_x:
        ax0.xaxis.set_major_locator(MaxNLocator(integer=True))
    if logy:
        ax0.set_yscale("log")
        span = _span(ys)
        if span < 100:  # one power of ten falls inside, or none: more labelled ticks
            ax0.yaxis.set_major_locator(LogLocator(10, subs=log_subs(span)))
    for axis, is_log in ((ax0.xaxis, logx), (ax0.yaxis, logy)):
        axis.set_major_formatter(FuncFormatter(short))
        if is_log:  # majors only: minor ticks on log axes cost a quarter of a plot's time
            axis.set_minor_locator(NullLocator())
    for ax in axes[-1]:
        ax.set_xlabel(xlabel, fontsize=9)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=9)
    for ax in axes.flat:
        ax.tick_params(labelsize=8)
    # The legend goes below the panels, in its own band, so many series never squeeze them.
    legend_h = legend_in / fig.get_figheight()
    fig.legend(*_handles(axes, labels_with_oom), loc="lower center", ncol=ncol, fontsize=7,
               frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.1 if cols > 1 else 0.12, right=0.98, top=1 - 0.45 / fig.get_figheight(),
                        bottom=legend_h + 0.55 / fig.get_figheight(), wspace=0.08, hspace=0.3)
    buf = io.BytesIO()
    # No timestamps in the file: the same data gives the same bytes.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _handles(axes, labels: list[str]) -> tuple[list, list[str]]:
    """One legend entry per label, taken from whichever panel drew it."""
    found = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(lab, h)
    return [found[k] for k in labels], labels


# The part that is left when the parts do not add up to the measured total (a phase not
# timed, or time between phases) is drawn when it is more than this share of the total.
_REST = 0.02


LEGEND_ROW, LEGEND_PAD = 0.055, 0.06  # a bar plot's legend: its rows' share of the axes


def bar_plot(plot: Bars) -> bytes:
    """Stacked bars on the left (a colour per part, the total above each bar), plain bars at
    the same positions on the right (their note above each); bars of one group side by side,
    groups apart, each bar labelled with its label over its group."""
    import_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullLocator

    xs: list[float] = []
    x, last = 0.0, None
    for b in plot.bars:
        if last is not None:
            x += 1.0 if b.group == last else 1.6  # a gap between groups
        xs.append(x)
        last = b.group
    # Each bar's own label under it (turned upright when there are several per group), the
    # group's once below those, centred under its bars.
    centres: dict[str, list[float]] = {}
    for xi, b in zip(xs, plot.bars, strict=True):
        centres.setdefault(b.group, []).append(xi)
    labelled = any(b.label for b in plot.bars)
    upright = labelled and len(plot.bars) > len(centres)
    drop_pt = 7 * 0.62 * max((len(b.label) for b in plot.bars), default=0) + 6 if upright else 12
    rests = []
    for b in plot.bars:
        known = sum(p for p in b.parts if p is not None)
        rest = (b.total - known) if b.total is not None else 0.0
        rests.append(rest if b.total and rest > _REST * b.total else 0.0)
    parts = [*plot.parts, *([plot.rest] if any(rests) else [])]
    side = any(b.side is not None for b in plot.bars)
    n = len(plot.bars)
    width_in = min(12.4, max(7.0, 0.55 * n * (1.6 if side else 1.0) + 2.2))
    fig = Figure(figsize=(width_in, 3.5 + (drop_pt + 12) / 72), dpi=100)
    axes = fig.subplots(1, 2 if side else 1, squeeze=False,
                        gridspec_kw={"width_ratios": [3, 2]} if side else None)[0]
    ax = axes[0]
    bottom = [0.0] * n
    legend_rows = bool(plot.total_mark)
    for i, name in enumerate(parts):
        heights = [((b.parts[i] if i < len(b.parts) else rests[j]) or 0.0)
                   for j, b in enumerate(plot.bars)]
        if not any(heights):
            continue
        legend_rows += 1
        ax.bar(xs, heights, 0.8, bottom=bottom, color="C7" if i >= len(plot.parts) else f"C{i}",
               label=name, edgecolor="white", linewidth=0.5)
        bottom = [a + h for a, h in zip(bottom, heights, strict=True)]
    totals = [b.total if b.total is not None else h for b, h in zip(plot.bars, bottom, strict=True)]
    if plot.total_mark:
        ax.hlines([b.total for b in plot.bars if b.total is not None],
                  [xi - 0.45 for xi, b in zip(xs, plot.bars, strict=True) if b.total is not None],
                  [xi + 0.45 for xi, b in zip(xs, plot.bars, strict=True) if b.total is not None],
                  colors="black", linewidth=1.4, label=plot.total_mark)
        bottom = [max(h, t) for h, t in zip(bottom, totals, strict=True)]
    top = max(bottom, default=0.0) or 1.0
    for xi, total, h in zip(xs, totals, bottom, strict=True):
        ax.text(xi, h + 0.01 * top, short_num(total), ha="center", va="bottom", fontsize=6.5)
    # headroom for the legend's rows (a part's each, the mark's), so it never sits on a bar's
    # total: the legend takes LEGEND_ROW of the axes' height a row (7 pt type on axes about
    # 2.9 in tall), the bars and their totals the rest
    legend = LEGEND_PAD + LEGEND_ROW * legend_rows
    ax.set_ylim(0, top * 1.06 / (1 - legend))
    ax.set_ylabel(plot.ylabel, fontsize=9)
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    if side:
        ax2 = axes[1]
        vals = [b.side or 0.0 for b in plot.bars]
        ax2.bar(xs, vals, 0.8, color="C4")
        log = _spans_decades(vals)
        if log:
            ax2.set_yscale("log")
            ax2.yaxis.set_minor_locator(NullLocator())
            ax2.set_ylim(min(v for v in vals if v > 0) / 2, max(vals) * 3)
        else:
            ax2.set_ylim(0, max(vals, default=1.0) * 1.15 or 1.0)
        for xi, b, v in zip(xs, plot.bars, vals, strict=True):
            if b.side_note and v:
                ax2.text(xi, v * (1.08 if log else 1.0) + (0 if log else 0.01 * max(vals)),
                         b.side_note, ha="center", va="bottom", fontsize=6.5 if n <= 12 else 5.5)
        ax2.set_ylabel(plot.side_label, fontsize=9)
        ax2.yaxis.set_major_formatter(FuncFormatter(_kilo))
        if plot.side_title:  # short: one line over a panel 2/5 of the figure wide
            ax2.set_title(plot.side_title, fontsize=8)
    for a in axes:
        a.set_xticks(xs)
        a.set_xticklabels([b.label for b in plot.bars] if labelled else [], fontsize=7,
                          rotation=90 if upright else 0)
        for group, at in centres.items():
            a.annotate(group, xy=(sum(at) / len(at), 0), xycoords=("data", "axes fraction"),
                       xytext=(0, -drop_pt - (4 if labelled else 0)), textcoords="offset points",
                       ha="center", va="top", fontsize=8, fontweight="bold")
        a.tick_params(axis="y", labelsize=8)
        if a is ax:
            a.yaxis.set_major_formatter(FuncFormatter(short))
        a.grid(True, axis="y", alpha=0.3)
        a.set_axisbelow(True)
    fig.suptitle(plot.title, fontsize=10)
    height = fig.get_figheight()
    # room on the left for the widest tick label (8 pt, about 0.6 em a character), the 9 pt
    # axis label and their pads: beside 50,000 MiB a fixed 8 % cut the label to "emory
    # (MiB)". Measured from the text rather than with bbox_inches="tight", whose second
    # layout pass cost the 10,000-run report 0.75 s.
    top_y = ax.get_ylim()[1]
    chars = max((len(short(t, None)) for t in ax.get_yticks() if 0 <= t <= top_y), default=4)
    left = (chars * 8 * 0.6 + 9 + 16) / 72 / width_in
    fig.subplots_adjust(left=max(0.08, left), right=0.99, top=1 - 0.45 / height,
                        bottom=(drop_pt + 24) / 72 / height, wspace=0.22)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _kilo(v: float, _pos: object = None) -> str:
    """A tick label of a count: 0, 500, 20k, 1.5M."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.4g}"


def short_num(v: float) -> str:
    """A value written on a bar: three significant figures, thousands grouped (74.7, 1,234)."""
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"
