"""A tiny PNG reader for the tests that look at pictures (the preview, the report's charts): zlib + struct, every
filter type undone, so that no test depends on which one the writer picked."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from comm2perfetto.trace.preview import COLOURS, WINDOW_KEY, PreviewRow, preview_layout


@dataclass
class Png:
    width: int
    height: int
    rows: list[bytes]  # unfiltered scanlines, 3 bytes a pixel
    text: dict[str, str] = field(default_factory=dict)  # the tEXt chunks: keyword -> text

    def px(self, x: int, y: int) -> tuple[int, int, int]:
        r = self.rows[y]
        return r[3 * x], r[3 * x + 1], r[3 * x + 2]

    def line(self, y: int, x0: int, x1: int) -> list[tuple[int, int, int]]:
        return [self.px(x, y) for x in range(x0, x1)]


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def read_png(path: Path) -> Png:
    """Checks the signature, every chunk's CRC and the header (8-bit RGB, no interlace); undoes all five
    filter types, so the test does not depend on which one the writer picked."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body), kind
        chunks.append((kind, body))
        pos += 12 + n
    assert pos == len(data)
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    w, h, depth, colour, compression, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, compression, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = w * 3
    assert len(raw) == h * (stride + 1)
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ft, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride) if ft else ():
            a = line[i - 3] if i >= 3 else 0
            c = prev[i - 3] if i >= 3 else 0
            pred = {1: a, 2: prev[i], 3: (a + prev[i]) // 2, 4: _paeth(a, prev[i], c)}[ft]
            line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    text = dict(body.decode("latin-1").split("\0", 1) for kind, body in chunks if kind == b"tEXt")
    return Png(w, h, rows, text)


def preview_rows(img: Png, n_rows: int) -> tuple[int, int, list[list[tuple[int, int, int]]]]:
    """A ``merge --preview`` picture's plot: its first column and width, found from the top time axis (the
    first image row with a long run of the axis colour), and each of its ``n_rows`` rows' top line of pixels
    (the compute half of a split bar)."""
    axis = COLOURS["axis"]
    for y in range(img.height):
        line = img.line(y, 0, img.width)
        xs = [x for x, c in enumerate(line) if c == axis]
        if len(xs) > img.width // 2 and xs[-1] - xs[0] + 1 == len(xs):
            plot_x, plot_w, plot_y = xs[0], len(xs), y + 1
            break
    else:
        raise AssertionError("no time axis in the picture")
    pitch = preview_layout([PreviewRow("r", [])] * n_rows, 0, 1).row_pitch
    return plot_x, plot_w, [img.line(plot_y + i * pitch, plot_x, plot_x + plot_w) for i in range(n_rows)]


def preview_window(img: Png) -> tuple[int, int]:
    """The window ``[t0, t1]`` (ns) a ``merge --preview`` picture draws, as its file says (``WINDOW_KEY``)."""
    t0, t1 = map(int, img.text[WINDOW_KEY].split())
    return t0, t1


def preview_compute_s(png: Path, ranks: list[int]) -> tuple[dict[int, float], float]:
    """The compute each rank's row of a ``merge --preview`` picture shows, in seconds (its compute-coloured
    columns times a column's time), and a column's time (the window the picture says it draws, over its plot's
    width)."""
    img = read_png(png)
    t0, t1 = preview_window(img)
    _, plot_w, lines = preview_rows(img, len(ranks))
    column_s = (t1 - t0) / plot_w * 1e-9
    compute = {COLOURS["compute"], COLOURS["overlap"]}
    return {r: sum(c in compute for c in line) * column_s for r, line in zip(ranks, lines)}, column_s
