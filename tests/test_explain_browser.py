"""The explain report's HTML page in a real browser (headless Chromium): it loads without a console
error, the graph drawing and the roofline chart are laid out with a size, a click on a kernel shows its
IR and source, and a screenshot shows the page with every kernel's colour (its op boxes and its
roofline point). Skips where no Chromium is installed (``.ci/run`` installs Debian's ``chromium``);
each browser run took 0.5 to 0.8 s on a 2-core machine (the first after installing it too)."""
from __future__ import annotations

import colorsys
import html
import json
import re
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
import torch

import minicomp
from tests.test_explain import MLP

BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # Debian's name first
BROWSER = next((path for path in map(shutil.which, BROWSERS) if path), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason=f"no headless browser (none of {', '.join(BROWSERS)} on "
                                                           "PATH; Debian: apt-get install chromium)")

WINDOW = (1000, 1400)  # pixels: the summary, the roofline chart and the MLP's graph drawing
HSL = re.compile(r"hsl\((\d+), (\d+)%, (\d+)%\)")  # the page's kernel colours (html.py)
MIN_WHITE = 0.5           # share of the pixels: the page's background (a mis-decoded PNG has little)
COLOUR_TOLERANCE = 2      # per channel: the browser's rounding of hsl() to 8 bits
MIN_KERNEL_PIXELS = 1000  # each kernel's op box in the drawing (~110 x 20 px) and its roofline point (~80)
BROWSER_SECONDS = 60      # a cold start under load takes a few seconds; a hang fails the test instead
# Runs as root in containers (no sandbox then), without a GPU; each run gets a fresh profile folder
# (``_browse``) so that parallel runs share none
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0")
# Chromium logs every console message to stderr as ``...:CONSOLE:N] "message", source: URL (line)``
CONSOLE = re.compile(r':CONSOLE[^\]]*\] "(.*)", source: ')
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PROBE_DONE = "explain probe done"  # the probe's own console message: proves console messages are seen

# Injected at the top of a copy of the page: every error (script, resource, rejected promise,
# console.error/warn) is recorded; after load it clicks the first kernel row (the page's own handler
# must show that kernel's IR and source) and writes what it saw into <body data-probe>.
PROBE = """<script>
var probeErrors = [];
window.addEventListener('error', function (e) {
  probeErrors.push(e.message || 'failed to load ' + (e.target.src || e.target.href || e.target.tagName));
}, true);
window.addEventListener('unhandledrejection', function (e) { probeErrors.push('rejected: ' + e.reason); });
['error', 'warn'].forEach(function (level) {
  var log = console[level];
  console[level] = function () {
    probeErrors.push(level + ': ' + Array.from(arguments).join(' '));
    log.apply(console, arguments);
  };
});
window.addEventListener('load', function () {
  function shown(selector) {
    var el = document.querySelector(selector);
    if (!el) return 'missing';
    var box = el.getBoundingClientRect();
    return box.width > 0 && box.height > 0 ? 'shown' : 'no size';
  }
  var row = document.querySelector('tr[data-kernel]');
  if (row) row.click();
  var detail = row && document.getElementById('detail-' + row.getAttribute('data-kernel'));
  document.body.setAttribute('data-probe', JSON.stringify({
    graph: shown('svg.graph'), chart: shown('svg.roofline'),
    ops: document.querySelectorAll('svg.graph .op').length,
    points: document.querySelectorAll('svg.roofline .point').length,
    detail: detail ? (detail.hidden ? 'hidden' : detail.textContent) : 'missing',
    errors: probeErrors}));
  console.log('""" + PROBE_DONE + """');
});
</script>"""


def _browse(url: str, profile, *action: str) -> subprocess.CompletedProcess:
    return subprocess.run([BROWSER, *FLAGS, f"--user-data-dir={profile}", *action, url], capture_output=True,
                          text=True, timeout=BROWSER_SECONDS, check=True)


def _console(stderr: str) -> list[str]:
    return CONSOLE.findall(stderr)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The MLP's report (interpreted kernels on the CPU: three of them), saved as HTML."""
    folder = tmp_path_factory.mktemp("explain")
    e = minicomp.explain(MLP().eval(), torch.randn(4, 16))
    return e, e.save(folder / "report.html")


@needs_browser
def test_page_loads_without_errors_and_shows_graph_and_chart(page, tmp_path):
    e, path = page
    probed = tmp_path / "probed.html"
    probed.write_text(path.read_text().replace("<head>", "<head>" + PROBE, 1))
    run = _browse(probed.as_uri(), tmp_path / "profile", "--dump-dom")
    assert _console(run.stderr) == [PROBE_DONE]  # nothing but the probe's own message
    attribute = re.search(r'data-probe="([^"]*)"', run.stdout)
    assert attribute, "the probe did not run: " + run.stdout[:300]
    seen = json.loads(html.unescape(attribute[1]))
    assert seen["errors"] == []
    assert (seen["graph"], seen["chart"]) == ("shown", "shown")
    assert seen["points"] == len(e.kernels) and seen["ops"] >= 4  # addmm, relu, addmm, softmax
    first = e.kernels[0].info.name
    assert first in seen["detail"] and "@triton.jit" in seen["detail"]  # its Triton source, shown on click


@needs_browser
def test_screenshot_shows_every_kernels_colour(page, tmp_path):
    e, path = page
    shot = tmp_path / "report.png"
    run = _browse(path.as_uri(), tmp_path / "profile", f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}")
    assert _console(run.stderr) == []
    pixels = png_pixels(shot.read_bytes())[..., :3].reshape(-1, 3).astype(int)
    assert len(pixels) == WINDOW[0] * WINDOW[1]
    white = (pixels == 255).all(1).mean()
    assert MIN_WHITE < white < 1  # the page's background, and more: not blank, and decoded right
    colours = sorted(set(HSL.findall(path.read_text())))
    assert len(colours) == len(e.kernels)
    for hue, saturation, lightness in colours:
        rgb = 255 * np.array(colorsys.hls_to_rgb(int(hue) / 360, int(lightness) / 100, int(saturation) / 100))
        drawn = (abs(pixels - rgb).max(1) <= COLOUR_TOLERANCE).sum()
        assert drawn > MIN_KERNEL_PIXELS, f"hsl({hue}, {saturation}%, {lightness}%): {drawn} pixels"


def test_png_decoder_undoes_every_filter():
    """``png_pixels`` against a PNG written here, one row per filter, by PNG's definition byte by byte."""
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert np.array_equal(png_pixels(_png(pixels, kinds=[0, 1, 2, 3, 4])), pixels)


def _png(pixels: np.ndarray, kinds: list[int]) -> bytes:
    """An RGB PNG of ``pixels`` whose row r is filtered by ``kinds[r]``."""
    height, width, channels = pixels.shape
    p = pixels.astype(int)

    def at(r, c, ch):
        return int(p[r, c, ch]) if r >= 0 and c >= 0 else 0

    def paeth(a, b, c):
        guess = a + b - c
        pa, pb, pc = abs(guess - a), abs(guess - b), abs(guess - c)
        return a if pa <= pb and pa <= pc else b if pb <= pc else c

    raw = bytearray()
    for r, kind in enumerate(kinds):
        raw.append(kind)
        for c in range(width):
            for ch in range(channels):
                a, b, ab = at(r, c - 1, ch), at(r - 1, c, ch), at(r - 1, c - 1, ch)
                predicted = (0, a, b, (a + b) // 2, paeth(a, b, ab))[kind]
                raw.append((p[r, c, ch] - predicted) % 256)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b"")
    return PNG_SIGNATURE + body


def png_pixels(data: bytes) -> np.ndarray:
    """An 8-bit, non-interlaced RGB or RGBA PNG's pixels as (rows, columns, channels) uint8."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length  # length, type, body, CRC
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, f"unsupported PNG {header}"
    channels = 3 if colour_type == 2 else 4
    rows = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, 1 + width * channels)
    return _unfilter(rows[:, 0], rows[:, 1:].reshape(height, width, channels))


def _unfilter(kinds: np.ndarray, filtered: np.ndarray) -> np.ndarray:
    """Undo PNG's per-row filters (none, sub, up, average, paeth: each predicts a byte from the pixels
    left, above and above-left). A pixel needs its left and upper neighbours first, so the pixels are
    rebuilt one anti-diagonal (row + column = d) at a time, every row's pixel of it at once."""
    height, width, channels = filtered.shape
    out = np.zeros((height + 1, width + 1, channels), np.int32)  # row 0, column 0: PNG's zeros outside
    kinds, filtered = kinds.astype(np.int64), filtered.astype(np.int32)
    for d in range(height + width - 1):
        r = np.arange(max(0, d - width + 1), min(height, d + 1))
        c = d - r
        left, up, up_left = out[r + 1, c], out[r, c + 1], out[r, c]
        guess = left + up - up_left
        to_left, to_up, to_up_left = abs(guess - left), abs(guess - up), abs(guess - up_left)
        paeth = np.where((to_left <= to_up) & (to_left <= to_up_left), left, np.where(to_up <= to_up_left, up, up_left))
        predicted = np.choose(kinds[r][:, None], [np.zeros_like(left), left, up, (left + up) // 2, paeth])
        out[r + 1, c + 1] = (filtered[r, c] + predicted) % 256
    return out[1:, 1:].astype(np.uint8)
