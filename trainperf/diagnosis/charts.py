"""Charts as inline SVG, and the HTML page around them: no plotting library, no scripts.

Each function returns one ``<svg>`` element (a string) or None when there is nothing to draw:
``line_chart`` (several series, gaps where a value is missing, optional right-hand axis that
rescales the left one), ``stacked_area`` (time per phase per step) and ``stacked_bars`` (one bar
per category). ``page`` wraps sections into one self-contained HTML document.
"""

from __future__ import annotations

import html
import math
from typing import Sequence

PALETTE = ["#2e86ab", "#e4572e", "#76b041", "#ffc914", "#17bebb", "#9b59b6", "#5f6b6d", "#d1495b"]
PHASE_COLORS = {"data": "#e4572e", "forward": "#17bebb", "backward": "#2e86ab", "optimizer": "#76b041",
                "comm": "#ffc914", "compile": "#9b59b6"}
W, H = 680, 320
LEFT, RIGHT, TOP, BOTTOM = 72, 72, 34, 46
MAX_LABELS = 16  # category labels (and bar values) drawn at most; more bars: every k-th label
MAX_POINTS = 1500  # longer series are averaged per bucket


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9)
    last = max(first + 1, math.ceil(hi / step - 1e-9))
    return [round(i * step, 12) for i in range(first, last + 1)]


def fmt_tick(v: float) -> str:
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:.4g}"


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def _decimate(pts: list[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
    if len(pts) <= MAX_POINTS:
        return pts
    k = math.ceil(len(pts) / MAX_POINTS)
    out = []
    for i in range(0, len(pts), k):
        chunk = [p for p in pts[i:i + k] if p[1] is not None]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)) if chunk
                   else (pts[i][0], None))
    return out


class _Frame:
    """Axes, ticks, labels and the mapping from data to pixels."""

    def __init__(self, xr: tuple[float, float], yr: tuple[float, float], *, title: str, xlabel: str, ylabel: str,
                 y2: tuple[float, str] | None = None, xcats: Sequence[str] | None = None):
        self.xt = nice_ticks(*xr) if xcats is None else None
        self.yt = nice_ticks(*yr)
        # categories: room on the right for the legend, so it never covers a bar
        self.x0, self.x1 = (self.xt[0], self.xt[-1]) if self.xt else (-0.5, 1.3 * len(xcats) - 0.2)
        self.y0, self.y1 = self.yt[0], self.yt[-1]
        self.parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
                      f'role="img" aria-label="{_esc(title)}" class="chart"><title>{_esc(title)}</title>',
                      f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>',
                      f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14" font-weight="600">'
                      f'{_esc(title)}</text>']
        g = self.parts
        for t in self.yt:
            y = self.py(t)
            g.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{fmt_tick(t)}</text>')
        if self.xt:
            for t in self.xt:
                x = self.px(t)
                g.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" stroke="#f0f0f0"/>'
                         f'<text x="{x:.1f}" y="{H - BOTTOM + 15}" text-anchor="middle" font-size="11">'
                         f'{fmt_tick(t)}</text>')
        else:
            every = max(1, math.ceil(len(xcats) / MAX_LABELS))  # 64 ranks: every 4th label, never overlapping
            for i, c in enumerate(xcats):
                if i % every:
                    continue
                g.append(f'<text x="{self.px(i):.1f}" y="{H - BOTTOM + 15}" text-anchor="middle" font-size="11">'
                         f'{_esc(c)}</text>')
        g.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" fill="none" '
                 f'stroke="#888"/>')
        g.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 8}" text-anchor="middle" font-size="12">'
                 f'{_esc(xlabel)}</text>')
        g.append(f'<text transform="translate(16 {(TOP + H - BOTTOM) / 2}) rotate(-90)" text-anchor="middle" '
                 f'font-size="12">{_esc(ylabel)}</text>')
        if y2 is not None:  # a second scale for the same line: value * factor
            factor, label = y2
            for t in self.yt:
                g.append(f'<text x="{W - RIGHT + 6}" y="{self.py(t) + 4:.1f}" font-size="11" fill="#e4572e">'
                         f'{t * factor:.3g}</text>')
            g.append(f'<text transform="translate({W - 14} {(TOP + H - BOTTOM) / 2}) rotate(90)" '
                     f'text-anchor="middle" font-size="12" fill="#e4572e">{_esc(label)}</text>')

    def px(self, x: float) -> float:
        return LEFT + (x - self.x0) / ((self.x1 - self.x0) or 1) * (W - LEFT - RIGHT)

    def py(self, y: float) -> float:
        return H - BOTTOM - (y - self.y0) / ((self.y1 - self.y0) or 1) * (H - TOP - BOTTOM)

    def legend(self, items: list[tuple[str, str, bool]]) -> None:
        """Top right, inside the plot, on a translucent box."""
        if not items:
            return
        width = 40 + 6.2 * max(len(label) for label, _, _ in items)
        x0 = W - RIGHT - 4 - width
        self.parts.append(f'<rect x="{x0:.0f}" y="{TOP + 3}" width="{width:.0f}" height="{15 * len(items) + 4}" '
                          'fill="#fff" fill-opacity="0.8" stroke="#ddd"/>')
        y = TOP + 14
        for label, color, dash in items:
            d = ' stroke-dasharray="5 3"' if dash else ""
            self.parts.append(f'<line x1="{x0 + 4:.0f}" x2="{x0 + 24:.0f}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" '
                              f'stroke-width="3"{d}/><text x="{x0 + 29:.0f}" y="{y}" font-size="11">{_esc(label)}'
                              '</text>')
            y += 15

    def done(self) -> str:
        return "".join(self.parts) + "</svg>"


def line_chart(series: list[dict], *, title: str, xlabel: str, ylabel: str, y2: tuple[float, str] | None = None,
               y_from_zero: bool = False) -> str | None:
    """``series``: [{"label", "x": [...], "y": [...], "color"?, "dash"?, "markers"?}]; a None y is a gap."""
    clean = []
    for i, s in enumerate(series):
        pts = [(float(x), _num(y)) for x, y in zip(s["x"], s["y"]) if _num(x) is not None]
        pts = _decimate(pts)
        if any(p[1] is not None for p in pts):
            clean.append((s, pts, s.get("color") or PALETTE[i % len(PALETTE)]))
    if not clean:
        return None
    xs = [p[0] for _, pts, _ in clean for p in pts]
    ys = [p[1] for _, pts, _ in clean for p in pts if p[1] is not None]
    lo, hi = min(ys), max(ys)
    if y_from_zero:
        lo = min(0.0, lo)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    f = _Frame((min(xs), max(xs)), (lo - (0 if y_from_zero and lo == 0 else pad), hi + pad),
               title=title, xlabel=xlabel, ylabel=ylabel, y2=y2)
    for s, pts, color in clean:
        dash = ' stroke-dasharray="5 3"' if s.get("dash") else ""
        run: list[str] = []
        segs = []
        for x, y in pts + [(0.0, None)]:
            if y is None:
                if run:
                    segs.append(run)
                run = []
            else:
                run.append(f"{f.px(x):.1f},{f.py(y):.1f}")
        for seg in segs:
            f.parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{" ".join(seg)}"/>')
            if s.get("markers") or len(seg) == 1:
                for p in seg:
                    cx, cy = p.split(",")
                    f.parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
    f.legend([(s["label"], c, bool(s.get("dash"))) for s, _, c in clean])
    return f.done()


def stacked_area(x: list[float], layers: list[tuple[str, list[float], str]], *, title: str, xlabel: str,
                 ylabel: str) -> str | None:
    """Layers stacked from the bottom, in order; each is (label, values per x, color)."""
    layers = [(n, [(_num(v) or 0.0) for v in ys], c) for n, ys, c in layers]
    if not x or not layers:
        return None
    tops = [sum(ys[i] for _, ys, _ in layers) for i in range(len(x))]
    f = _Frame((min(x), max(x)), (0.0, max(tops) * 1.05 or 1.0), title=title, xlabel=xlabel, ylabel=ylabel)
    base = [0.0] * len(x)
    for name, ys, color in layers:
        top = [b + v for b, v in zip(base, ys)]
        if len(x) == 1:
            pts = [(x[0] - 0.4, base[0]), (x[0] + 0.4, base[0]), (x[0] + 0.4, top[0]), (x[0] - 0.4, top[0])]
        else:
            pts = list(zip(x, top)) + list(zip(reversed(x), reversed(base)))
        poly = " ".join(f"{f.px(a):.1f},{f.py(b):.1f}" for a, b in pts)
        f.parts.append(f'<polygon points="{poly}" fill="{color}" fill-opacity="0.85" stroke="none"/>')
        base = top
    f.legend([(n, c, False) for n, _, c in reversed(layers)])
    return f.done()


def stacked_bars(cats: list[str], stacks: list[tuple[str, list[float], str]], *, title: str, ylabel: str,
                 xlabel: str = "") -> str | None:
    """One bar per category, made of the stacks (label, value per category, color)."""
    stacks = [(n, [(_num(v) or 0.0) for v in vals], c) for n, vals, c in stacks]
    if not cats or not stacks:
        return None
    tops = [sum(vals[i] for _, vals, _ in stacks) for i in range(len(cats))]
    f = _Frame((0, 1), (0.0, max(tops) * 1.1 or 1.0), title=title, xlabel=xlabel, ylabel=ylabel, xcats=cats)
    width = min(80.0, 0.6 * (W - LEFT - RIGHT) / len(cats))
    base = [0.0] * len(cats)
    for name, vals, color in stacks:
        for i, v in enumerate(vals):
            if v <= 0:
                continue
            y_top, y_bot = f.py(base[i] + v), f.py(base[i])
            f.parts.append(f'<rect x="{f.px(i) - width / 2:.1f}" y="{y_top:.1f}" width="{width:.1f}" '
                           f'height="{y_bot - y_top:.1f}" fill="{color}"><title>{_esc(cats[i])}: {_esc(name)} '
                           f'{v:.4g}</title></rect>')
        base = [b + v for b, v in zip(base, vals)]
    for i, t in enumerate(tops if len(cats) <= MAX_LABELS else []):  # many bars: the values are in each bar's title
        f.parts.append(f'<text x="{f.px(i):.1f}" y="{f.py(t) - 4:.1f}" text-anchor="middle" font-size="11">'
                       f'{fmt_tick(t)}</text>')
    f.legend([(n, c, False) for n, _, c in reversed(stacks) if any(vals)])
    return f.done()


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1500px; color: #222; padding: 0 1em; }
table { border-collapse: collapse; margin: 1em 0; } td, th { border: 1px solid #ccc; padding: 4px 8px;
text-align: left; vertical-align: top; font-size: 0.9em; } th { background: #f3f3f3; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; } figure { margin: 0; }
svg.chart { border: 1px solid #ddd; max-width: 100%; height: auto; } .critical { background: #fde2dd; }
.warning { background: #fff4cc; } .info { background: #e8f1fb; } .headline { font-size: 1.25em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
"""


def figure(name: str, svg: str) -> str:
    return f'<figure data-chart="{_esc(name)}">{svg}<figcaption>{_esc(name)}</figcaption></figure>'


def page(title: str, body: str) -> str:
    """One self-contained HTML document: inline CSS and SVG, nothing fetched, no scripts."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="generator" content="trainperf">'
            f"<title>{_esc(title)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def table(rows: list[list[str]], header: list[str] | None = None, num_cols: Sequence[int] = ()) -> str:
    """Cells are escaped here."""
    head = "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(
        (f"<th>{_esc(c)}</th>" if j == 0 and header is None else
         f"<td{' class=num' if j in num_cols else ''}>{_esc(c)}</td>") for j, c in enumerate(r)) + "</tr>"
        for r in rows)
    return f"<table>{head}{body}</table>"
