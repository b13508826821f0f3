"""A compact PNG picture of a whole job, ranks x time, for people who cannot open a trace in a browser.

Standard library only: the PNG is written by hand (8-bit RGB, filter 0, zlib) and the text uses a tiny
bitmap font defined below. Never imports torch.

Picture, top to bottom: the title; the legend (one swatch per kind, plus "compute+comm" and "idle") and the
caller's notes; a time axis labelled with the time since ``t0`` (``0 s``, ``500 ms``, ``1.00 s``); one row per
:class:`PreviewRow`, labelled in a left gutter; the time axis again under the rows. Rows are as tall as the
count allows: up to :data:`MAX_ROW_PITCH` px for a few dozen rows, down to one pixel each for thousands (labels
then go on every Nth row only, N a power of two so that node boundaries of 2^k GPUs get one).

What a row shows, in the order it is drawn (later on top): the classes of ``report.classes``, the one
classification every view draws (``merge --preview`` passes each rank's):

- ``nodata`` spans, grey: time the rank's data does not cover (a rank without data: the whole row);
- ``compute``, ``comm`` and ``memory`` spans, drawn in proportion to the time they cover: a column is coloured
  where the running total of the kind's covered time, in columns, rounds up past the columns coloured so far
  (error diffusion along the row), so that a row shows each kind's share of every stretch of time to the
  nearest column, however finely its work is cut: compute and comm fractions read off the picture are the
  report's. A zero-length span (a collective with no duration, gloo's) is drawn :data:`INSTANT_W` columns wide.
  Where compute and comm both colour one column of a row, the row is split: upper half compute, lower half
  comm, so overlap stays visible; a row too thin to split shows the ``overlap`` colour. Memory shows where
  neither does;
- ``stalled`` spans (a rank waiting in a collective the others never joined), hatched, and always drawn to
  the right edge: a stall has no end inside the window;
- ``missing`` and ``mismatch`` spans, solid;
- marks (point events) last: a core of :data:`MARK_W` px in the kind's colour with a black pixel each side,
  at least :data:`MARK_MIN_H` px tall, so an instant is visible at any zoom, even at ``t1`` itself.

What is left is idle, with the time ticks continued through it as a grid.

Speed: each span is turned into a column range once and filled into a per-row, per-kind bytearray by slice
assignment (the proportional kinds: its partial end columns and a difference array for the whole ones, summed
at C speed); the kinds are then packed into one code byte per column (as bits of one big int, which costs
nothing per column in Python) and mapped to RGB with ``bytes.translate``. No Python loop ever runs per pixel
of a span, so 2 million spans take two to three seconds (``benchmarks/bench_preview.py``).

Example::

    rows = [PreviewRow("rank 0", [(t, t + 5_000_000, "compute"), (t + 5_000_000, t + 7_000_000, "comm")])]
    stats = render_preview("job.png", rows, t, t + 10_000_000, title="job 42")
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add, sub
from pathlib import Path
from types import MappingProxyType

from comm2perfetto.words import duration

__all__ = ["COLOURS", "INSTANT_W", "KINDS", "PROPORTIONAL", "WINDOW_KEY", "PreviewLayout", "PreviewRow",
           "PreviewStats", "preview_layout", "render_preview", "time_ticks"]

KINDS = ("compute", "comm", "memory", "stalled", "missing", "mismatch", "nodata")
PROPORTIONAL = ("compute", "comm", "memory")  # drawn in proportion to the time they cover (see above)
INSTANT_W = 2  # px of a zero-length compute, comm or memory span
WINDOW_KEY = "comm2perfetto window"  # the PNG's tEXt keyword for the drawn window, "<t0 ns> <t1 ns>"

RGB = tuple[int, int, int]

# Okabe-Ito hues (chosen to stay apart under the common colour-vision deficiencies) for the kinds; compute
# (blue) and comm (orange) differ in hue and in lightness. "stalled" is vermillion *and* hatched, because
# vermillion next to orange is the one pair that needs more than colour. Marks are saturated magenta /
# yellow with black edges: they must pop out of any background, including each other's.
COLOURS: Mapping[str, RGB] = MappingProxyType({
    "compute": (0, 114, 178),
    "comm": (230, 159, 0),
    "overlap": (0, 158, 115),  # compute and comm in one column of a row too thin to split in halves
    "memory": (86, 180, 233),
    "nodata": (160, 160, 160),  # as report --plot's "no data"
    "stalled": (213, 94, 0),
    "stripe": (70, 20, 0),  # the hatching of stalled spans
    "missing": (220, 0, 220),
    "mismatch": (245, 230, 40),
    "outline": (0, 0, 0),  # the edges of marks
    "idle": (236, 236, 230),  # a row with nothing on: light, so that everything else is darker than it
    "grid": (216, 216, 208),  # time ticks continued through idle parts of rows
    "background": (255, 255, 255),
    "text": (25, 25, 25),
    "axis": (110, 110, 110),
})

# --- geometry (published so that callers and tests derive positions instead of guessing them) -----------

MARGIN = 8
GLYPH_W, GLYPH_H = 5, 8  # font cell; row 7 is the descender, capitals use rows 0-6
ADVANCE = GLYPH_W + 1  # px from one character to the next at scale 1
LINE_H = 11  # px from one text line to the next at scale 1
TITLE_SCALE = 2
LEGEND_LINE_H = 14
SWATCH_W, SWATCH_H = 16, 10
TICK_LEN = 4
MAX_LABEL_CHARS = 20  # longer row labels are cut, so a silly label cannot eat the plot
MIN_PLOT_W = 64
PLOT_BUDGET_H = 1200  # rows share about this many px; each gets at least 1 and at most MAX_ROW_PITCH
MAX_ROW_PITCH = 16
MARK_W = 5  # px of a mark's coloured core; one outline px more on each side where the plot has room
MARK_MIN_H = 5  # rows of 1-3 px would hide a mark as short as they are
TICK_SPACING = 100  # at least this many px between time ticks, room for a label like "12.5 ms"
HATCH_PERIOD, HATCH_WIDTH = 6, 2  # stalled hatching: diagonal stripes HATCH_WIDTH of every HATCH_PERIOD px

# Bits of the per-column code byte (see _row_tables). Kinds keep KINDS order: bit i is KINDS[i]. The grid is
# drawn over idle columns after the colours (no bit left for it).
_BIT = {k: 1 << i for i, k in enumerate(KINDS)}
_STRIPE = 1 << len(KINDS)


@dataclass(frozen=True, slots=True)
class PreviewRow:
    """One row of the picture: usually one rank.

    ``spans``: ``(t_begin_ns, t_end_ns, kind)``, ``kind`` in :data:`KINDS`, any order, may overlap.
    ``marks``: ``(t_ns, kind)`` point events, drawn as markers on top of everything.
    """

    label: str
    spans: Sequence[tuple[int, int, str]]
    marks: Sequence[tuple[int, str]] = ()


@dataclass(frozen=True, slots=True)
class PreviewLayout:
    """Where everything is in the picture, in pixels; ``x`` grows rightwards, ``y`` downwards.

    The plot is ``plot_w`` columns from ``plot_x``; column ``c`` shows times ``[t0 + c*dt/plot_w,
    t0 + (c+1)*dt/plot_w)`` with ``dt = t1 - t0``. Row ``i`` starts at ``plot_y + i*row_pitch``; its bar is
    the first ``bar_h`` px of that, the rest (if any) is a background gap between rows.
    """

    width: int
    height: int
    t0: int
    t1: int
    n_rows: int
    plot_x: int
    plot_y: int
    plot_w: int
    plot_h: int
    row_pitch: int
    bar_h: int
    label_every: int  # rows with ``i % label_every == 0`` get a label
    label_chars: int  # the longest label drawn, in characters (after cutting to MAX_LABEL_CHARS)
    title_y: int
    legend_y: int
    legend_lines: int
    notes_y: int
    axis_label_y: int  # the top time axis' labels; the bottom axis' are at bottom_label_y
    bottom_label_y: int

    @property
    def gutter(self) -> tuple[int, int]:
        """The label gutter's columns, ``[x0, x1)``."""
        return MARGIN, self.plot_x

    def col(self, t: int) -> int:
        """The plot column (0-based, relative to ``plot_x``) whose time range holds ``t``, clamped."""
        c = (t - self.t0) * self.plot_w // (self.t1 - self.t0)
        return min(max(c, 0), self.plot_w - 1)

    def x_of(self, t: int) -> int:
        """The image column whose time range holds ``t`` (clamped to the plot)."""
        return self.plot_x + self.col(t)

    def span_x(self, t_begin: int, t_end: int) -> tuple[int, int] | None:
        """Image columns ``[x0, x1)`` a span covers: every column whose time range it touches, at least one;
        None when it is wholly outside ``[t0, t1]``. A stalled span is drawn from ``x0`` to the right edge
        (from the left edge if it began before the window: a stall lasts)."""
        if t_end < self.t0 or t_begin > self.t1:
            return None
        dt, w = self.t1 - self.t0, self.plot_w
        c0 = max((t_begin - self.t0) * w // dt, 0)
        c1 = min(-((self.t0 - t_end) * w // dt), w)  # ceiling
        if c1 <= c0:
            c0 = min(c0, w - 1)
            c1 = c0 + 1
        return self.plot_x + c0, self.plot_x + c1

    def mark_x(self, t: int) -> tuple[int, int]:
        """Image columns ``[x0, x1)`` of a mark's coloured core: MARK_W px around ``t``'s column, shifted
        inwards at the plot's edges so that a mark at ``t0`` or ``t1`` is as wide as any other."""
        c = min(max(self.col(t) - MARK_W // 2, 0), self.plot_w - MARK_W)
        return self.plot_x + c, self.plot_x + c + MARK_W

    def row_y(self, i: int) -> tuple[int, int]:
        """Image rows ``[y0, y1)`` of row ``i``'s bar."""
        y0 = self.plot_y + i * self.row_pitch
        return y0, y0 + self.bar_h

    def split_y(self, i: int) -> int | None:
        """The first image row of row ``i``'s lower (comm) half, where compute and comm overlap; None when
        the bar is too thin to split, and overlap shows the ``overlap`` colour instead."""
        if self.bar_h < 2:
            return None
        return self.plot_y + i * self.row_pitch + self.bar_h // 2

    def mark_y(self, i: int) -> tuple[int, int]:
        """Image rows ``[y0, y1)`` of a mark on row ``i``: the bar, grown to MARK_MIN_H px around its middle
        (over the neighbouring rows) when thinner, and kept inside the plot."""
        y0, y1 = self.row_y(i)
        if y1 - y0 < MARK_MIN_H:
            y0 = min(max(y0 + (y1 - y0) // 2 - MARK_MIN_H // 2, self.plot_y), self.plot_y + self.plot_h - MARK_MIN_H)
            y1 = y0 + MARK_MIN_H
        return max(y0, self.plot_y), min(y1, self.plot_y + self.plot_h)

    def label_y(self, i: int) -> int:
        """The top image row of row ``i``'s label text: its capitals centred on the bar."""
        y0, y1 = self.row_y(i)
        return y0 + (y1 - y0) // 2 - 3


@dataclass(frozen=True, slots=True)
class PreviewStats:
    """What :func:`render_preview` wrote."""

    path: str
    width: int
    height: int
    bytes: int
    layout: PreviewLayout


# --- font -------------------------------------------------------------------------------------------------
# Printable ASCII, " " (32) to "~" (126), 8 characters a glyph, one character per pixel row top to bottom.
# Each character is a row's 5 pixels as a number 0-31 written in _FONT_DIGITS; the leftmost pixel is the
# highest bit (16). Capitals and digits sit on rows 0-6; row 7 takes the descenders of g j p q y , _.

_FONT_DIGITS = "0123456789abcdefghijklmnopqrstuv"
_FONT = (
    "0000000044444040aa000000aavavaa04fke5u40op248j30cik8lid044800000"  # space ! " # $ % & '
    "248884208422248004lel400044v440000000c48000v000000000cc011248gg0"  # ( ) * + , - . /
    "ehjlphe04c4444e0eh1248v0v2421he026aiv220vgu11he068guhhe0v1248880"  # 0 1 2 3 4 5 6 7
    "ehhehhe0ehhf12c00cc0cc000cc0c480248g842000v0v00084212480eh124040"  # 8 9 : ; < = > ?
    "ehnlmgf0ehhvhhh0uhhuhhu0ehggghe0sihhhis0vgguggv0vgguggg0ehgnhhf0"  # @ A B C D E F G
    "hhhvhhh0e44444e072222ic0hikokih0ggggggv0hrllhhh0hhpljhh0ehhhhhe0"  # H I J K L M N O
    "uhhuggg0ehhhlid0uhhukih0fgge11u0v4444440hhhhhhe0hhhhha40hhhllla0"  # P Q R S T U V W
    "hha4ahh0hha44440v1248gv0e88888e0gg842110e22222e04ah000000000000v"  # X Y Z [ \ ] ^ _
    "8400000000e1fhf0ggmphhu000egghe011djhhf000ehvge0698s888000fhhf1e"  # ` a b c d e f g
    "ggmphhh040c444e0206222icggikoki0c44444e000qllll000mphhh000ehhhe0"  # h i j k l m n o
    "00uhhugg00fhhf1100mpggg000fge1u088s8896000hhhjd000hhha4000hhlla0"  # p q r s t u v w
    "00ha4ah000hhhf1e00v248v03448443044444440o44244o0008l2000"  # x y z { | } ~
)


def _glyph_runs() -> dict[str, tuple[tuple[int, int, int], ...]]:
    """Each glyph as horizontal runs ``(dx, dy, length)``: text is drawn a run, not a pixel, at a time."""
    glyphs: dict[str, tuple[tuple[int, int, int], ...]] = {}
    for code in range(32, 127):
        enc = _FONT[(code - 32) * GLYPH_H:(code - 31) * GLYPH_H]
        runs = []
        for dy, ch in enumerate(enc):
            bits = _FONT_DIGITS.index(ch)
            dx = 0
            while dx < GLYPH_W:
                if bits & (1 << (GLYPH_W - 1 - dx)):
                    start = dx
                    while dx < GLYPH_W and bits & (1 << (GLYPH_W - 1 - dx)):
                        dx += 1
                    runs.append((start, dy, dx - start))
                else:
                    dx += 1
        glyphs[chr(code)] = tuple(runs)
    return glyphs


_GLYPHS = _glyph_runs()


def text_width(text: str, scale: int = 1) -> int:
    """Width in px of ``text`` drawn at ``scale`` (no trailing gap)."""
    return max(len(text) * ADVANCE * scale - scale, 0)


# --- layout -----------------------------------------------------------------------------------------------

_LEGEND = (("compute", "compute"), ("comm", "comm"), ("compute+comm", "split"), ("memory", "memory"),
           ("stalled", "stalled"), ("missing", "missing"), ("mismatch", "mismatch"), ("idle", "idle"),
           ("no data", "nodata"))
_LEGEND_GAP = 14  # px between one legend item's name and the next swatch


def _legend_positions(width: int) -> list[tuple[int, int, str, str]]:
    """``(x, line, name, swatch)`` of each legend item: left to right, wrapped to the picture's width."""
    out = []
    x, line = MARGIN, 0
    for name, swatch in _LEGEND:
        w = SWATCH_W + 4 + text_width(name)
        if x > MARGIN and x + w > width - MARGIN:
            x, line = MARGIN, line + 1
        out.append((x, line, name, swatch))
        x += w + _LEGEND_GAP
    return out


def _shown_label(label: str) -> str:
    label = "".join(c if " " <= c <= "~" else "?" for c in label)
    return label if len(label) <= MAX_LABEL_CHARS else label[:MAX_LABEL_CHARS - 2] + ".."


def preview_layout(rows: Sequence[PreviewRow], t0: int, t1: int, *, notes: Sequence[str] = (),
                   width: int = 1600) -> PreviewLayout:
    """The geometry :func:`render_preview` draws with, for these arguments. Raises ValueError where there is
    nothing to draw (no rows, ``t1 <= t0``) or no room to draw it."""
    if not rows:
        raise ValueError("preview: no rows to draw")
    if t1 <= t0:
        raise ValueError(f"preview: empty time window, t1 ({t1}) <= t0 ({t0})")
    n = len(rows)
    pitch = min(max(PLOT_BUDGET_H // n, 1), MAX_ROW_PITCH)
    bar_h = pitch - 1 if pitch >= 4 else pitch  # a 1 px gap between rows once they can spare it
    every = 1
    while every * pitch < LINE_H:  # labels must not overlap; powers of two, the usual GPUs per node
        every *= 2
    label_chars = max(len(_shown_label(rows[i].label)) for i in range(0, n, every))
    plot_x = MARGIN + label_chars * ADVANCE + 8
    plot_w = width - plot_x - MARGIN
    if plot_w < MIN_PLOT_W:
        raise ValueError(f"preview: width {width} px leaves {plot_w} px for the plot, need at least {MIN_PLOT_W}")
    title_y = MARGIN
    legend_y = title_y + GLYPH_H * TITLE_SCALE + 6
    legend_lines = _legend_positions(width)[-1][1] + 1
    notes_y = legend_y + legend_lines * LEGEND_LINE_H
    axis_label_y = notes_y + len(notes) * LINE_H + 4
    plot_y = axis_label_y + LINE_H + TICK_LEN + 1
    plot_h = n * pitch
    bottom_label_y = plot_y + plot_h + TICK_LEN + 2
    return PreviewLayout(
        width=width, height=bottom_label_y + LINE_H + MARGIN, t0=t0, t1=t1, n_rows=n,
        plot_x=plot_x, plot_y=plot_y, plot_w=plot_w, plot_h=plot_h, row_pitch=pitch, bar_h=bar_h,
        label_every=every, label_chars=label_chars, title_y=title_y, legend_y=legend_y,
        legend_lines=legend_lines, notes_y=notes_y, axis_label_y=axis_label_y, bottom_label_y=bottom_label_y,
    )


def time_ticks(layout: PreviewLayout) -> list[tuple[int, str]]:
    """``(x, label)`` of the time axis' ticks: a 1-2-5 step in ns, as many as fit TICK_SPACING apart."""
    dt = layout.t1 - layout.t0
    most = max(layout.plot_w // TICK_SPACING, 1)
    step, k = 1, 0
    while dt // step > most:
        k += 1
        step = (1, 2, 5)[k % 3] * 10 ** (k // 3)
    return [(layout.x_of(layout.t0 + i * step), duration(i * step)) for i in range(dt // step + 1)]


# --- drawing ----------------------------------------------------------------------------------------------


class _Canvas:
    """An RGB image in one bytearray, row-major, 3 bytes a pixel; everything drawn is clipped to it."""

    __slots__ = ("h", "pix", "w")

    def __init__(self, w: int, h: int, rgb: RGB) -> None:
        self.w, self.h = w, h
        self.pix = bytearray(bytes(rgb) * (w * h))

    def rect(self, x0: int, y0: int, x1: int, y1: int, rgb: RGB) -> None:
        x0, x1 = max(x0, 0), min(x1, self.w)
        if x1 <= x0:
            return
        run = bytes(rgb) * (x1 - x0)
        stride = self.w * 3
        for y in range(max(y0, 0), min(y1, self.h)):
            self.pix[y * stride + x0 * 3:y * stride + x1 * 3] = run

    def text(self, x: int, y: int, text: str, rgb: RGB, scale: int = 1, x_max: int | None = None) -> None:
        """Draws ``text`` with its top-left at ``(x, y)``; nothing right of ``x_max`` (default: the edge)."""
        x_max = self.w if x_max is None else min(x_max, self.w)
        for ch in text:
            if x >= x_max:
                break
            for dx, dy, n in _GLYPHS.get(ch, _GLYPHS["?"]):
                self.rect(x + dx * scale, y + dy * scale, min(x + (dx + n) * scale, x_max),
                          y + (dy + 1) * scale, rgb)
            x += ADVANCE * scale

    def png(self, text: Mapping[str, str] = MappingProxyType({})) -> bytes:
        """The image as a PNG file: 8-bit RGB, no interlace, every scanline with filter 0 (None); ``text``:
        ``tEXt`` chunks (keyword -> Latin-1 text), which image viewers list as the file's properties.

        Filter 0 costs nothing to apply and zlib already squeezes the long runs of flat colour this picture
        is made of; the Sub/Up/Paeth filters would need a Python pass over every byte."""
        stride = self.w * 3
        raw = bytearray((stride + 1) * self.h)  # the zero at the start of each scanline is its filter type
        for y in range(self.h):
            raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)] = self.pix[y * stride:(y + 1) * stride]

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        return b"".join((
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)),
            *(chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1")) for key, value in text.items()),
            chunk(b"IDAT", zlib.compress(bytes(raw), 6)),
            chunk(b"IEND", b""),
        ))


def _colour_of(code: int, variant: str) -> RGB:
    """The colour of one column's code byte; ``variant``: "top" / "bottom" half of a split bar, or "thin"."""
    for kind in ("mismatch", "missing"):
        if code & _BIT[kind]:
            return COLOURS[kind]
    if code & _BIT["stalled"]:
        return COLOURS["stripe" if code & _STRIPE else "stalled"]
    compute, comm = code & _BIT["compute"], code & _BIT["comm"]
    if compute and comm:
        return COLOURS[{"top": "compute", "bottom": "comm", "thin": "overlap"}[variant]]
    for kind in ("comm", "compute", "memory", "nodata"):
        if code & _BIT[kind]:
            return COLOURS[kind]
    return COLOURS["idle"]


def _row_tables() -> dict[str, tuple[bytes, bytes, bytes]]:
    """Per variant, three 256-entry ``bytes.translate`` tables: code byte -> red, green, blue."""
    tables = {}
    for variant in ("top", "bottom", "thin"):
        cols = [_colour_of(code, variant) for code in range(256)]
        red, green, blue = (bytes(c[i] for c in cols) for i in range(3))
        tables[variant] = (red, green, blue)
    return tables


_TABLES = _row_tables()


def _proportion(part: list[float], whole: list[int], w: int) -> int:
    """The columns to colour (as bytes 0/1 of a big int) for a kind's coverage: ``part`` the fraction of each
    column its spans' partial ends cover, ``whole`` a difference array of the columns they cover whole. A
    column is coloured where the running total of covered columns, rounded, goes up: as many columns as the
    spans cover, to the nearest one, each as near its time as the rounding allows."""
    covered = list(map(add, part[:w], accumulate(whole[:w])))
    if max(covered) > 1.0:  # spans of one kind that overlap (unions never do): a column holds one at most
        covered = list(map(min, covered, repeat(1.0)))
    levels = [0, *map(int, map((0.5).__add__, accumulate(covered)))]
    return int.from_bytes(bytes(map(sub, levels[1:], levels[:-1])), "big")


def _draw_rows(canvas: _Canvas, layout: PreviewLayout, rows: Sequence[PreviewRow], grid_cols: Sequence[int]
               ) -> None:
    t0, dt, w = layout.t0, layout.t1 - layout.t0, layout.plot_w
    t1 = layout.t1
    ones = memoryview(b"\x01" * w)
    stripes = []  # per (y % HATCH_PERIOD): the stripe bit where a diagonal stripe crosses that image row
    for phase in range(HATCH_PERIOD):
        stripes.append(int.from_bytes(
            bytes(_STRIPE if (c + phase) % HATCH_PERIOD < HATCH_WIDTH else 0 for c in range(w)), "big"))
    grid_rgb = bytes(COLOURS["grid"])
    stride, x_off = canvas.w * 3, layout.plot_x * 3
    pix = canvas.pix
    half = layout.bar_h // 2
    split = layout.bar_h >= 2
    scale = w / dt  # columns per ns
    for i, row in enumerate(rows):
        cov = {k: bytearray(w) for k in KINDS}
        parts = {k: ([0.0] * (w + 1), [0] * (w + 1)) for k in PROPORTIONAL}
        try:
            for b, e, kind in row.spans:
                acc = parts.get(kind)
                if acc is not None and e > b:  # the hot path of a busy row: tests inlined, no calls but int()
                    if b < t0:
                        if e <= t0:
                            continue
                        b = t0
                    if e > t1:
                        if b >= t1:
                            continue
                        e = t1
                    x0, x1 = (b - t0) * scale, (e - t0) * scale
                    c0, c1 = int(x0), int(x1)
                    part = acc[0]
                    if c0 == c1:
                        part[c0] += x1 - x0
                    else:
                        part[c0] += c0 + 1 - x0
                        part[c1] += x1 - c1
                        whole = acc[1]
                        whole[c0 + 1] += 1
                        whole[c1] -= 1
                    continue
                # The same columns as PreviewLayout.span_x, inlined: this loop runs once per span, so the
                # common case (inside the window, at least a column wide) takes a single test.
                c0 = (b - t0) * w // dt
                c1 = -((t0 - e) * w // dt)  # ceiling
                if b == e and kind in PROPORTIONAL:  # an instant: wide enough to see
                    c0 = min(max(c0, 0), w - INSTANT_W)
                    c1 = c0 + INSTANT_W
                    if b < t0 or b > t1:
                        continue
                if c0 < 0 or c1 > w or c1 <= c0 or b > e:
                    if b > e:
                        raise ValueError(f"preview: row {i} ({row.label!r}): span ends before it begins: "
                                         f"({b}, {e}, {kind!r})")
                    if b > t1 or (e < t0 and kind != "stalled"):  # a stall before the window lasts into it
                        continue
                    c0, c1 = max(c0, 0), min(c1, w)
                    if c1 <= c0:
                        if c0 >= w:
                            c0 = w - 1
                        c1 = c0 + 1
                if c1 - c0 == 1:  # most spans of a busy row: an item store is 4x cheaper than a slice
                    cov[kind][c0] = 1
                else:
                    cov[kind][c0:c1] = ones[:c1 - c0]
        except KeyError:
            raise ValueError(f"preview: row {i} ({row.label!r}): unknown span kind {kind!r}, "
                             f"expected one of {', '.join(KINDS)}") from None
        stalled = cov["stalled"]
        first = stalled.find(1)
        if first >= 0:  # a stall does not end inside the window: from its first column to the edge
            stalled[first:] = ones[:w - first]
        code = 0
        for bit, kind in enumerate(KINDS):
            bits = int.from_bytes(cov[kind], "big")  # each byte is 0 or 1: the shift stays in it
            if kind in parts and (any(parts[kind][1]) or any(parts[kind][0])):
                bits |= _proportion(*parts[kind], w)
            code |= bits << bit
        y0 = layout.plot_y + i * layout.row_pitch
        lines: dict[tuple[str, int], bytearray] = {}
        for dy in range(layout.bar_h):
            variant = ("top" if dy < half else "bottom") if split else "thin"
            phase = (y0 + dy) % HATCH_PERIOD if first >= 0 else -1
            line = lines.get((variant, phase))
            if line is None:
                codes = (code | stripes[phase] if phase >= 0 else code).to_bytes(w, "big")
                r, g, b_ = _TABLES[variant]
                line = bytearray(w * 3)
                line[0::3] = codes.translate(r)
                line[1::3] = codes.translate(g)
                line[2::3] = codes.translate(b_)
                for c in grid_cols:  # the time ticks continued through idle columns
                    if not codes[c] & ~_STRIPE:
                        line[3 * c:3 * c + 3] = grid_rgb
                lines[variant, phase] = line
            off = (y0 + dy) * stride + x_off
            pix[off:off + w * 3] = line
    # Marks after every row's spans: a thin row's marks reach over its neighbours and must stay on top.
    for i, row in enumerate(rows):
        if not row.marks:
            continue
        my0, my1 = layout.mark_y(i)
        drawn = set()
        for t, kind in row.marks:
            if kind not in _BIT:
                raise ValueError(f"preview: row {i} ({row.label!r}): unknown mark kind {kind!r}, "
                                 f"expected one of {', '.join(KINDS)}")
            if t < t0 or t > t1:
                continue
            x0, x1 = layout.mark_x(t)
            if (x0, kind) in drawn:
                continue
            drawn.add((x0, kind))
            _draw_mark(canvas, layout, x0, x1, my0, my1, COLOURS[kind])


def _draw_mark(canvas: _Canvas, layout: PreviewLayout, x0: int, x1: int, y0: int, y1: int, rgb: RGB) -> None:
    """A mark's core ``[x0, x1)`` in ``rgb`` with one black column each side where the plot has room."""
    canvas.rect(max(x0 - 1, layout.plot_x), y0, min(x1 + 1, layout.plot_x + layout.plot_w), y1,
                COLOURS["outline"])
    canvas.rect(x0, y0, x1, y1, rgb)


def _draw_swatch(canvas: _Canvas, x: int, y: int, swatch: str, thin: bool) -> None:
    x1, y1 = x + SWATCH_W, y + SWATCH_H
    if swatch in ("compute", "comm", "memory", "nodata"):
        canvas.rect(x, y, x1, y1, COLOURS[swatch])
    elif swatch == "split":  # as the rows of this picture show overlap: split, or one colour if too thin
        if thin:
            canvas.rect(x, y, x1, y1, COLOURS["overlap"])
        else:
            canvas.rect(x, y, x1, y + SWATCH_H // 2, COLOURS["compute"])
            canvas.rect(x, y + SWATCH_H // 2, x1, y1, COLOURS["comm"])
    elif swatch == "stalled":
        canvas.rect(x, y, x1, y1, COLOURS["stalled"])
        for yy in range(y, y1):  # 160 px: a per-pixel loop is fine here
            for xx in range(x, x1):
                if (xx + yy) % HATCH_PERIOD < HATCH_WIDTH:
                    canvas.rect(xx, yy, xx + 1, yy + 1, COLOURS["stripe"])
    else:  # idle, missing, mismatch: an idle box with a border, marks drawn in it as in the plot
        canvas.rect(x, y, x1, y1, COLOURS["axis"])
        canvas.rect(x + 1, y + 1, x1 - 1, y1 - 1, COLOURS["idle"])
        if swatch != "idle":
            mx = x + (SWATCH_W - MARK_W) // 2
            canvas.rect(mx - 1, y + 1, mx + MARK_W + 1, y1 - 1, COLOURS["outline"])
            canvas.rect(mx, y + 1, mx + MARK_W, y1 - 1, COLOURS[swatch])


def _draw_axis(canvas: _Canvas, layout: PreviewLayout, ticks: Sequence[tuple[int, str]], line_y: int,
               tick_y0: int, label_y: int) -> None:
    axis = COLOURS["axis"]
    canvas.rect(layout.plot_x, line_y, layout.plot_x + layout.plot_w, line_y + 1, axis)
    for x, label in ticks:
        canvas.rect(x, tick_y0, x + 1, tick_y0 + TICK_LEN, axis)
        lx = min(max(x - text_width(label) // 2, layout.plot_x), layout.width - MARGIN - text_width(label))
        canvas.text(lx, label_y, label, COLOURS["text"])


def render_preview(path: str | Path, rows: Sequence[PreviewRow], t0: int, t1: int, *, title: str,
                   notes: Sequence[str] = (), width: int = 1600) -> PreviewStats:
    """Draws ``rows`` over the window ``[t0, t1]`` (ns) and writes the picture to ``path`` as a PNG.

    Raises ValueError for nothing to draw (no rows, ``t1 <= t0``), a ``width`` too small for the plot, a
    kind not in :data:`KINDS` or a span that ends before it begins; OSError where ``path`` cannot be
    written. Text outside printable ASCII is drawn as "?"; text too long for the picture is cut. The file
    says the window it draws in a ``tEXt`` chunk, ``WINDOW_KEY``: ``"<t0> <t1>"``."""
    layout = preview_layout(rows, t0, t1, notes=notes, width=width)
    canvas = _Canvas(layout.width, layout.height, COLOURS["background"])
    text = COLOURS["text"]
    canvas.text(MARGIN, layout.title_y, title, text, scale=TITLE_SCALE, x_max=layout.width - MARGIN)
    for x, line, name, swatch in _legend_positions(layout.width):
        y = layout.legend_y + line * LEGEND_LINE_H
        _draw_swatch(canvas, x, y, swatch, thin=layout.split_y(0) is None)
        canvas.text(x + SWATCH_W + 4, y + (SWATCH_H - 7) // 2, name, text)
    for k, note in enumerate(notes):
        canvas.text(MARGIN, layout.notes_y + k * LINE_H, note, text, x_max=layout.width - MARGIN)

    ticks = time_ticks(layout)
    _draw_axis(canvas, layout, ticks, layout.plot_y - 1, layout.plot_y - 1 - TICK_LEN, layout.axis_label_y)
    bottom = layout.plot_y + layout.plot_h
    _draw_axis(canvas, layout, ticks, bottom, bottom, layout.bottom_label_y)
    _draw_rows(canvas, layout, rows, [x - layout.plot_x for x, _ in ticks[1:]])

    label_x1 = layout.plot_x - 6  # labels end here, right-aligned; a short tick points at the row
    for i in range(0, layout.n_rows, layout.label_every):
        label = _shown_label(rows[i].label)
        canvas.text(label_x1 - text_width(label), layout.label_y(i), label, text, x_max=label_x1)
        if layout.label_every > 1:
            y0, y1 = layout.row_y(i)
            cy = y0 + (y1 - y0) // 2
            canvas.rect(layout.plot_x - 4, cy, layout.plot_x - 1, cy + 1, COLOURS["axis"])

    data = canvas.png({WINDOW_KEY: f"{t0} {t1}"})
    p = Path(path)
    p.write_bytes(data)
    return PreviewStats(path=str(p), width=layout.width, height=layout.height, bytes=len(data), layout=layout)
