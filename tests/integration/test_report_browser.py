"""The HTML report in a real headless browser: every plot decodes and shows ink, nothing is fetched.

The test injects a small script into a copy of the report; on the page's load event it draws each
<img> on a canvas, counts non-white pixels and writes the figures into attributes of <body>,
which `chromium --dump-dom` then prints. A copy with a corrupted image checks that the probe can
fail. Skips when no Chromium is installed (CI installs Debian's `chromium` package).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from synthetic_records import make_matrix, write_jsonl

from ditbench.report.load import load_results
from ditbench.report.render import write_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)

pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")

PROBE = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var stats = imgs.map(function (img) {
    var ink = -1;
    try {
      var c = document.createElement("canvas");
      c.width = img.naturalWidth; c.height = img.naturalHeight;
      var ctx = c.getContext("2d");
      ctx.drawImage(img, 0, 0);
      var d = ctx.getImageData(0, 0, c.width, c.height).data;
      ink = 0;
      for (var i = 0; i < d.length; i += 4) { if (d[i] < 200 || d[i + 1] < 200 || d[i + 2] < 200) ink++; }
      ink = ink / (d.length / 4);
    } catch (e) { ink = -1; }
    var shown = img.getBoundingClientRect();
    return [img.naturalWidth, img.naturalHeight, Math.round(shown.width), ink].join(",");
  });
  var fetched = performance.getEntriesByType("resource").filter(function (r) {
    return !/^data:/.test(r.name);
  }).length;
  document.body.setAttribute("data-plots", stats.join(";"));
  document.body.setAttribute("data-fetched", String(fetched));
  document.body.setAttribute("data-loaded", String(imgs.length > 0 && imgs.every(function (i) {
    return i.complete && i.naturalWidth > 0;
  })));
});
</script>"""


def render_in_browser(html_path: Path, profile: Path) -> dict[str, str]:
    cmd = [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--window-size=1280,2000",
        "--dump-dom",
        html_path.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert body, f"no <body> in the DOM Chromium dumped: {proc.stdout[:500]!r}"
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', body.group(1)))


def with_probe(src: Path, dst: Path, corrupt: bool = False) -> Path:
    html = src.read_text(encoding="utf-8")
    if corrupt:  # replace the first plot's PNG with bytes that are not an image
        html = re.sub(
            r'src="data:image/png;base64,[^"]+"', 'src="data:image/png;base64,bm90IGEgcG5n"', html, count=1
        )
    dst.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    return dst


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    records = make_matrix(
        models=("DiT-B/8", "DiT-L/4"), batches=(8, 16, 32), gpu_memory_gib=24, smoke_steps=30
    )
    write_jsonl(tmp / "results.jsonl", records)
    write_report(load_results(tmp / "results.jsonl"), tmp / "report")
    return tmp / "report"


def test_every_plot_renders_in_chromium(report_dir, tmp_path):
    page = with_probe(report_dir / "report.html", tmp_path / "probe.html")
    attrs = render_in_browser(page, tmp_path / "profile")
    assert attrs["loaded"] == "true"
    assert attrs["fetched"] == "0"  # self-contained: nothing loaded from outside the file
    plots = [tuple(float(x) for x in p.split(",")) for p in attrs["plots"].split(";")]
    assert len(plots) == 4  # speed against memory, throughput, memory, smoke loss
    for natural_w, natural_h, shown_w, ink in plots:
        assert natural_w > 300 and natural_h > 200
        assert shown_w > 100  # laid out on the page, not collapsed
        assert 0.005 < ink < 0.5  # lines, text and axes drawn on a mostly white figure


def test_the_probe_sees_a_broken_image(report_dir, tmp_path):
    page = with_probe(report_dir / "report.html", tmp_path / "broken.html", corrupt=True)
    attrs = render_in_browser(page, tmp_path / "profile")
    assert attrs["loaded"] == "false"
    assert attrs["plots"].split(";")[0].startswith("0,0,")
