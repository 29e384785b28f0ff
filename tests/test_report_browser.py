"""The HTML report opened in headless Chromium: every section and image there, no network.

Chromium must be installed (`make test` does it: apt-get install -y chromium); without it
this test fails rather than skips, so a missing browser is never mistaken for a pass.
Network: Chromium runs with every host name mapped to NOTFOUND and its network log on; the
log must show no request for anything but the file itself, and the HTML holds no URL that
could load (checked statically too, in test_report.py).
"""

import json
import shutil
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from cs336sys.cli import app
from tests.report_fixture import build

SECTIONS = ("model", "attention", "memory", "memory-residuals", "comm", "ddp", "profile",
            "precision", "compare")  # fmt: skip


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, (
        "headless Chromium is needed for this test and was not found: "
        "install it with `apt-get install -y chromium` (Debian) or run `make test`"
    )
    return exe


def _open(exe: str, page: Path, tmp: Path) -> tuple[str, set[str]]:
    """The DOM after loading `page`, and the URLs the page itself asked the network for.

    The net log also holds Chromium's own background requests (update checks, time
    service); those carry initiator 'not an origin', while a document's requests carry
    its origin ('null' for a file: page), so only the latter are the page's.
    """
    netlog = tmp / f"{page.stem}-netlog.json"
    proc = subprocess.run(
        [exe, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         "--disable-background-networking", "--disable-component-update",
         f"--user-data-dir={tmp / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
         f"--log-net-log={netlog}", "--virtual-time-budget=2000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and "</html>" in proc.stdout, proc.stderr[-2000:]
    text = netlog.read_text(errors="replace").rstrip()
    # Chromium may leave the log's closing brackets unwritten when it exits.
    log = json.loads(text if text.endswith("}") else text.rstrip(",") + "]}")
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = {
        e["params"]["url"]
        for e in log["events"]
        if e["type"] == start_job and e.get("params", {}).get("initiator", "not an origin")
        != "not an origin"
    }
    return proc.stdout, urls


def test_report_in_headless_chromium(tmp_path):
    exe = _chromium()
    db = build(tmp_path / "results.db")
    result = CliRunner().invoke(
        app, ["report", "--db", str(db), "--out", str(tmp_path / "out"), "--format", "html",
              "--compare", "aaaa", "bbbb"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    dom, urls = _open(exe, tmp_path / "out" / "report.html", tmp_path)
    for sec in SECTIONS:
        assert f'<section id="{sec}">' in dom, sec
    assert dom.count('<img src="data:image/png;base64,') == 6
    assert not urls, urls
    # The check can see a page's request: a canary page with a remote image is caught.
    canary = tmp_path / "canary.html"
    canary.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    _, canary_urls = _open(exe, canary, tmp_path)
    assert canary_urls == {"http://example.invalid/x.png"}
