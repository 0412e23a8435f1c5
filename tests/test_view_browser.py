"""The pages in a real browser (headless Chromium, Debian's `chromium` package): the
screenshot is not blank, a search given in the URL (`#search=NAME`) finds the layer and
moves the view to it; the LLM pictures (issue 25): `view --around` on a 28-block decoder
(hubs stubbed, <= 60 layers, opened centred on the target), the overview ("28 × block"),
a diff with the changed param in its box, the side panel with every param, a compare page
with its legend and first divergence. Marked `browser`; skipped when chromium is not
installed (`.ci/run` installs it where it can). Screenshots are kept in
$PARAMSURGERY_SHOTS when that is set (to look at them)."""

import os

import re
import shutil
from pathlib import Path
import struct
import subprocess
import zlib

import pytest

from paramsurgery.cli import main

from conftest import FIXTURES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.browser,
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_search_with_no_match(tmp_path):
    page = tmp_path / "tiny.html"
    assert main(["view", str(TINY / "talker_decoder.ported.ncnn.param"), "-o", str(page)]) == 0
    r = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000",
                 page.as_uri() + "#search=no_such_layer")
    assert 'data-hits="0"' in r.stdout and "0 matches" in r.stdout


SHOTS = os.environ.get("PARAMSURGERY_SHOTS")


def shoot(tmp_path, page, name: str, fragment: str = "", size=(1400, 900)):
    """Screenshot and DOM of `page` (after its script ran) in headless Chromium."""
    shot = tmp_path / f"{name}.png"
    uri = page.as_uri() + fragment
    r = chromium(tmp_path, f"--screenshot={shot}", f"--window-size={size[0]},{size[1]}",
                 "--virtual-time-budget=2000", uri)
    assert shot.exists(), r.stderr[-2000:]
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        (Path(SHOTS) / shot.name).write_bytes(shot.read_bytes())
    dom = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000",
                   f"--window-size={size[0]},{size[1]}", uri).stdout
    return png_pixels(shot), dom


def colour_count(pixels, hex_colour: str) -> int:
    want = bytes.fromhex(hex_colour)
    return sum(1 for px in pixels if px == want)


def viewbox(dom: str, svg_id: str) -> tuple[float, ...]:
    m = re.search(rf'<svg id="{svg_id}" class="graph[^"]*" viewBox="([-\d. e]+)"', dom)
    assert m, svg_id
    return tuple(map(float, m.group(1).split()))


def box_centre(dom: str, name: str) -> tuple[float, float]:
    m = re.search(rf'data-name="{re.escape(name)}"[^>]*transform="translate\(([-\d.]+),'
                  rf'([-\d.]+)\)"><title>[^<]*</title><rect width="([\d.]+)" height="([\d.]+)"',
                  dom)
    assert m, name
    x, y, w, h = map(float, m.groups())
    return x + w / 2, y + h / 2


@pytest.fixture(scope="module")
def decoder28(tmp_path_factory):
    """The real-size talker decoder (28 blocks) with a kv cache: the 56-top `kv_cache_in`
    Input and the mask / rope Splits read by every block."""
    d = tmp_path_factory.mktemp("dec")
    out = d / "kv.param"
    assert main(["add-kvcache", str(REAL_TALKER), "-o", str(out)]) == 0
    return out


def test_around_on_a_28_block_decoder(tmp_path, decoder28, capsys):
    page = tmp_path / "around.html"
    assert main(["view", str(decoder28), "--around", "sdpa_577", "--depth", "6", "-o",
                 str(page)]) == 0
    n = int(re.search(r"\((\d+) layers\)", capsys.readouterr().out).group(1))
    assert n <= 60  # 493 of 851 before the walk stopped at hubs
    (w, h, pixels), dom = shoot(tmp_path, page, "around")
    assert dom.count('class="box layer') == n
    # the hubs: kv_cache_in (56 tops) and the rope Splits, one stub each
    assert re.search(r'class="box hub hub" data-name="kv_cache_in"', dom)
    assert colour_count(pixels, "ede9fe") > 200  # a hub stub on screen
    # opened centred on the target, at a readable scale
    vx, vy, vw, vh = viewbox(dom, "g0")
    cx, cy = box_centre(dom, "sdpa_577")
    assert abs(cx - (vx + vw / 2)) < 2 and abs(cy - (vy + vh / 2)) < 2
    assert vw <= 1500
    # the middle of the screen is the target's box, not white
    mid = [pixels[y * w + x] for y in range(h // 2 - 40, h // 2) for x in range(w // 2 - 40,
                                                                               w // 2 + 40)]
    assert sum(px != b"\xff\xff\xff" for px in mid) > 100


def test_overview_of_a_decoder(tmp_path):
    page = tmp_path / "whole.html"
    assert main(["view", str(REAL_TALKER), "-o", str(page)]) == 0
    (w, h, pixels), dom = shoot(tmp_path, page, "overview")
    # the 28 blocks are one group box; the overview is what is shown, the full drawing
    # one click away
    assert re.search(r'class="box group group" data-name="28 × block"', dom)
    assert "overview: 28 repeated blocks of 30 layers" in dom
    assert re.search(r'<svg id="g0" class="graph"[^>]*style="display: ?none;?"', dom)
    overview_boxes = re.findall(r'<g id="g0o-n\d+" class="box layer', dom)
    assert 10 <= len(overview_boxes) <= 40
    assert colour_count(pixels, "e0f2fe") > 5000  # the group box, readable size
    # #expand (as a click on the group) shows every layer
    dom2 = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000",
                    page.as_uri() + "#expand").stdout
    assert re.search(r'<svg id="g0o" class="graph overview"[^>]*style="display: ?none;?"', dom2)


def test_diff_shows_the_changed_param_and_the_panel_every_param(tmp_path):
    src = TINY / "talker_decoder.ported.ncnn.param"
    edited = tmp_path / "e.param"
    assert main(["set-param", str(src), "--layer", "sdpa_43", "scale=0.5", "-o",
                 str(edited)]) == 0
    page = tmp_path / "diff.html"
    assert main(["diff", str(src), str(edited), "--html", str(page)]) == 1
    (w, h, pixels), dom = shoot(tmp_path, page, "diff", "#search=sdpa_43")
    # in both boxes, in full: the param, before and after
    assert dom.count(">6(scale): 0.25 → 0.5</text>") == 2
    assert colour_count(pixels, "fef08a") > 500  # the changed boxes on screen
    # a click shows every param of the layer in the side panel (#pick= does the click)
    dom3 = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000",
                    page.as_uri() + "#pick=sdpa_43").stdout
    panel = dom3[dom3.index('<aside id="panel"'):dom3.index("</aside>")]
    assert "hidden" not in panel[:40]
    assert "6(scale): 0.25 → 0.5" in panel and "scale" in panel
    assert "…" not in panel


def test_compare_page_has_a_legend_and_the_first_divergence(tmp_path):
    pytest.importorskip("ncnn")
    src = TINY / "talker_decoder.ported.ncnn.param"
    edited = tmp_path / "x.param"
    assert main(["set-param", str(src), "--layer", "rmsn_17", "eps=0.01", "-o",
                 str(edited)]) == 0
    page = tmp_path / "cmp.html"
    assert main(["compare", str(edited), str(TINY / "talker_decoder.ported.ncnn.bin"),
                 "--reference", str(src), "--inputs", str(TINY / "talker_decoder.ported.ref.npz"),
                 "--html", str(page)]) == 1
    (w, h, pixels), dom = shoot(tmp_path, page, "compare")
    legend = dom[dom.index('id="value-legend"'):]
    legend = legend[:legend.index("</span>")]
    assert "≤ tol 0.001: agrees" in legend and "&gt; tol: differs" in legend
    assert "first divergence: rmsn_17" in legend
    # the tolerance is the colour break: every box out of tolerance is yellow to red,
    # never green, whatever its rel; those within are green
    for over, style in re.findall(r'data-over="([01])"[^>]*><title>[^<]*</title><rect [^>]*'
                                  r'style="fill:hsl\((\d+),', dom):
        assert (int(style) <= 50) if over == "1" else (int(style) == 130)
    assert re.search(r'data-name="rmsn_17"[^>]*data-over="1"', dom)
    # the page opens on the first divergence, outlined and labelled
    assert re.search(r'class="box layer plain first" data-name="rmsn_17"', dom)
    vx, vy, vw, vh = viewbox(dom, "g0")
    cx, cy = box_centre(dom, "rmsn_17")
    assert vx <= cx <= vx + vw and vy <= cy <= vy + vh
    assert ">▶ first divergence</text>" in dom
