"""The pages in a real browser (headless Chromium, Debian's `chromium` package): the
screenshot is not blank, and a search given in the URL (`#search=NAME`) finds the layer
and moves the view to it. Skipped when chromium is not installed."""

import re
import shutil
import struct
import subprocess
import zlib

import pytest

from paramsurgery.cli import main

from conftest import FIXTURES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]

TINY = FIXTURES / "qwen3_tts" / "tiny"
REAL_TALKER = FIXTURES / "qwen3_tts" / "real" / "talker_decoder.ported.ncnn.param"


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True, text=True, timeout=180)


def png_pixels(path) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows of an 8-bit RGB(A) PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, [r[i:i + 3] for r in rows for i in range(0, len(r), bpp)]


def test_screenshot_is_not_blank(tmp_path):
    page = tmp_path / "kv.html"
    assert main(["add-kvcache", str(TINY / "talker_decoder.ported.ncnn.param"), "-o",
                 str(tmp_path / "kv.param"), "--report", str(page)]) == 0
    shot = tmp_path / "shot.png"
    r = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,800",
                 page.as_uri())
    assert shot.exists(), r.stderr[-2000:]
    w, h, pixels = png_pixels(shot)
    assert (w, h) == (1000, 800)
    colours = {}
    for px in pixels:
        colours[px] = colours.get(px, 0) + 1
    white = colours.get(b"\xff\xff\xff", 0)
    assert len(colours) > 50  # text, boxes, the diff colours
    assert white < 0.97 * len(pixels)
    # the diff colours are on screen: changed (yellow) and added (green) boxes
    assert colours.get(bytes.fromhex("fef08a"), 0) > 200
    assert colours.get(bytes.fromhex("bbf7d0"), 0) > 200


@pytest.mark.parametrize("query", ["sdpa_564", "rmsn_336"])
def test_search_in_the_url_finds_the_layer(tmp_path, query):
    page = tmp_path / "real.html"
    assert main(["view", str(REAL_TALKER), "-o", str(page)]) == 0
    r = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=3000", "--window-size=1200,900",
                 page.as_uri() + f"#search={query}")
    dom = r.stdout
    assert 'data-hits="1"' in dom and f'data-first="{query}"' in dom, r.stderr[-2000:]
    assert re.search(rf'class="box layer plain hit" data-name="{query}"', dom)
    assert f"1 match: {query}" in dom
    # the view moved to the layer: its box is inside the svg's viewBox
    box = re.search(rf'data-name="{query}"[^>]*transform="translate\(([-\d.]+),([-\d.]+)\)"',
                    dom)
    vb = re.search(r'<svg id="g0" class="graph" viewBox="([-\d. e]+)"', dom)
    x, y = float(box.group(1)), float(box.group(2))
    vx, vy, vw, vh = map(float, vb.group(1).split())
    assert vx <= x <= vx + vw and vy <= y <= vy + vh and vy > 1000


def test_search_with_no_match(tmp_path):
    page = tmp_path / "tiny.html"
    assert main(["view", str(TINY / "talker_decoder.ported.ncnn.param"), "-o", str(page)]) == 0
    r = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000",
                 page.as_uri() + "#search=no_such_layer")
    assert 'data-hits="0"' in r.stdout and "0 matches" in r.stdout
