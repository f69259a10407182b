"""Open the built book in headless Chromium, as a reader would, and report what its pages show wrong.

Each page is loaded from disk with the network off for the browser (every host name fails to
resolve), its scripts run and MathJax finishes typesetting; then the page is read back and these
are defects:

- ``raw table``: markdown table syntax (``|---|``, or ``|—|`` after smart quotes) in the page's text;
- ``raw TeX``: ``\\(``, ``\\[``, ``$$`` or ``\\begin{`` in the page's text after MathJax ran;
- ``error output``: a traceback, papermill's error cell or a docutils error message;
- ``stderr output``: a stderr stream among a cell's outputs, on the page or in the page's
  downloadable notebook (``_sources/...ipynb``, which keeps what the book's ``nb_output_stderr:
  remove`` hides): a log line of some process, not the chapter's output;
- ``broken image``: an image that loaded no pixels;
- ``broken link``: a link to a local file that does not exist;
- ``external request``: any http(s)/ws(s) request the page made, and any script, stylesheet,
  image or frame with an address on another host (links a reader may follow are fine).

"Text" is what the page shows outside code blocks, scripts and styles, collapsed outputs included.
The browser is driven over the Chrome DevTools protocol on a pipe (``--remote-debugging-pipe``),
so the ``chromium`` binary is all it needs. Screenshots of the top of each page, its first figure
and its first table go to ``_build/screenshots/``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from iclnb.contract import CHROMIUM, ROOT

HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
NOT_PAGES = {"genindex.html", "search.html"}

PATTERNS = {
    "raw table": re.compile(r"\|\s*:?(?:-{3,}|[—–][-—–]*):?\s*\|[^\n]*"),  # smart quotes: --- is —
    "raw TeX": re.compile(r"\\\(|\\\[|\$\$|\\begin\{"),
}

# The first figure and the first table of a page, for the screenshots (READ_PAGE tells whether
# they exist).
SELECTORS = {"figure": ".cell_output img, figure img", "table": ".cell_output table, article table"}
# (selector) -> the element's box in page coordinates, scrolled into view first: measured when the
# screenshot is taken, since the box read at load time can move before then (a figure's clip
# landed on a code cell in chapter 4)
RECT = """sel => {
    const e = document.querySelector(sel);
    if (!e) return null;
    e.scrollIntoView({block: "start"});
    const r = e.getBoundingClientRect();
    return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height};
  }"""

# Runs in the page once it has loaded: waits for MathJax and the images, then reads the page.
READ_PAGE = r"""
(async () => {
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  const mathjax = () => window.MathJax && MathJax.startup && MathJax.startup.promise;
  for (let t = 0; t < 50 && window.MathJax && !mathjax(); t++) await sleep(100);
  if (mathjax()) await Promise.race([mathjax(), sleep(30000)]);
  const images = [...document.images];
  images.forEach(i => { i.loading = "eager"; });
  await Promise.race([Promise.all(images.map(i => i.decode().catch(() => null))), sleep(10000)]);
  const text = [], walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n; (n = walk.nextNode());)
    if (!n.parentElement.closest("pre, code, script, style, textarea, mjx-container")) text.push(n.data);
  const rect = sel => {
    const e = document.querySelector(sel);
    if (!e) return null;
    const r = e.getBoundingClientRect();
    return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height};
  };
  const addr = e => e.src || e.href || e.data || "";
  return {
    text: text.join("\n"),
    errors: [...document.querySelectorAll(".traceback, .output.error, .system-message, #papermill-error-cell")]
      .map(e => e.innerText.trim().slice(0, 120)),
    stderr: [...document.querySelectorAll(".output.stderr")].map(e => e.innerText.trim().slice(0, 120)),
    broken_images: images.filter(i => !i.naturalWidth).map(i => (i.currentSrc || i.src).slice(0, 120)),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    resources: [...document.querySelectorAll("script[src], link[href], img[src], iframe[src], source[src], " +
                                              "video[src], audio[src], embed[src], object[data]")].map(addr),
    images: images.length,
    math: document.querySelectorAll("mjx-container").length,
    figure: rect(".cell_output img, figure img"),
    table: rect(".cell_output table, article table"),
  };
})()
"""


class BrowserError(RuntimeError):
    """Chromium could not be started or stopped answering."""


def find_browser() -> str | None:
    """The Chromium binary: ``$ICLNB_CHROMIUM`` when set, else the first of :data:`BROWSERS` on the PATH."""
    names = [os.environ[CHROMIUM]] if os.environ.get(CHROMIUM) else BROWSERS
    return next(filter(None, map(shutil.which, names)), None)


class Chromium:
    """Headless Chromium with the network off, driven over the DevTools protocol on a pipe.

    ``with Chromium() as b: b.open(url); b.evaluate(js); b.screenshot(path)``; ``b.requests`` then
    holds every URL the page requested since it was opened.
    """

    def __init__(self, binary: str | None = None, width: int = 1280, height: int = 900, timeout: float = 60):
        self.binary = binary or find_browser()
        if not self.binary:
            tried = os.environ.get(CHROMIUM) or f"{', '.join(BROWSERS)}; or set ICLNB_CHROMIUM"
            raise BrowserError(f"no Chromium found (tried {tried}); on Debian: apt-get install chromium")
        self.size, self.timeout = (width, height), timeout
        self.requests: list[str] = []
        self._id, self._buf = 0, b""

    def __enter__(self):
        self._profile = tempfile.mkdtemp(prefix="iclnb-chromium-")
        to_browser, self._in = os.pipe()  # the browser reads commands on its fd 3 ...
        self._out, from_browser = os.pipe()  # ... and writes answers and events on its fd 4

        def fds_3_and_4():  # in the child, before exec: copies first, so neither dup2 clobbers the other
            a, b = os.dup(to_browser), os.dup(from_browser)
            os.dup2(a, 3)
            os.dup2(b, 4)

        flags = ["--headless", "--remote-debugging-pipe", f"--user-data-dir={self._profile}",
                 f"--window-size={self.size[0]},{self.size[1]}", "--hide-scrollbars", "--disable-gpu",
                 "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                 "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost"]
        if os.geteuid() == 0:
            flags.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self._log = open(Path(self._profile) / "stderr.txt", "w+b")
        self.proc = subprocess.Popen([self.binary, *flags, "about:blank"], preexec_fn=fds_3_and_4, close_fds=False,
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        os.close(to_browser)
        os.close(from_browser)
        try:
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Network", "Runtime"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        try:
            if self.proc.poll() is None:
                self._send("Browser.close")
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        for fd in (self._in, self._out):
            os.close(fd)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}} | ({"sessionId": session} if session else {})
        os.write(self._in, json.dumps(msg).encode() + b"\0")
        return self._id

    def _next(self, deadline: float) -> dict:
        """The next message from the browser; records the page's requests on the way."""
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._out], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._out, 1 << 20) if ready else None
            if not chunk:
                self._log.seek(0)
                tail = self._log.read()[-2000:].decode(errors="replace")
                raise BrowserError(("Chromium did not answer in time" if chunk is None else "Chromium exited")
                                   + f" ({self.binary}); its last output:\n{tail}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg = json.loads(raw)
        if msg.get("method") == "Network.requestWillBeSent":
            self.requests.append(msg["params"]["request"]["url"])
        elif msg.get("method") == "Network.webSocketCreated":
            self.requests.append(msg["params"]["url"])
        return msg

    def _wait(self, match, what: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._next(deadline)
            if match(msg):
                if "error" in msg:
                    raise BrowserError(f"{what}: {msg['error'].get('message', msg['error'])}")
                return msg

    def _call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        i = self._send(method, params, session)
        return self._wait(lambda m: m.get("id") == i, method)["result"]

    def call(self, method: str, params: dict | None = None) -> dict:
        """A DevTools command on the page, e.g. ``call("Page.navigate", {"url": ...})``."""
        return self._call(method, params, self._session)

    def open(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        self.requests = []
        self.call("Page.navigate", {"url": url})
        self._wait(lambda m: m.get("method") == "Page.loadEventFired" and m.get("sessionId") == self._session,
                   f"loading {url}")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in r:
            raise BrowserError(f"script error in the page: {r['exceptionDetails'].get('exception', r)}")
        return r["result"].get("value")

    def screenshot(self, path: Path, clip: dict | None = None, pad: int = 8) -> Path:
        """A PNG of the viewport, or of ``clip`` (page coordinates, in the current viewport: scroll the
        element into view first) with ``pad`` pixels around it."""
        params = {"format": "png"}
        if clip:
            x, y = max(0, clip["x"] - pad), max(0, clip["y"] - pad)
            # the caller scrolled the element into view: capture the viewport as laid out (with
            # captureBeyondViewport Chromium lays the page out again at full height, and the box moves)
            params |= {"captureBeyondViewport": False,
                       "clip": {"x": x, "y": y, "width": clip["width"] + 2 * pad, "height": clip["height"] + 2 * pad,
                                "scale": 1}}
        else:
            self.evaluate("window.scrollTo(0, 0)")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", params)["data"]))
        return path


@dataclass
class PageReport:
    page: Path
    defects: list[tuple[str, str]] = field(default_factory=list)  # (kind, what)
    math: int = 0  # formulas typeset by MathJax
    images: int = 0
    screenshots: list[Path] = field(default_factory=list)

    @property
    def kinds(self) -> set[str]:
        return {k for k, _ in self.defects}


def _external(url: str) -> bool:
    u = urlparse(url)
    return u.scheme in ("http", "https", "ws", "wss") and (u.hostname or "") not in LOCAL_HOSTS


def _missing_local(url: str) -> bool:
    u = urlparse(url)
    return u.scheme == "file" and not Path(unquote(u.path)).exists()


def _defects(seen: dict, requests: list[str]) -> list[tuple[str, str]]:
    found = []
    for kind, pattern in PATTERNS.items():
        found += [(kind, seen["text"][max(0, m.start() - 40):m.start() + 80].replace("\n", " "))
                  for m in pattern.finditer(seen["text"])][:3]
    found += [("error output", e) for e in seen["errors"]]
    found += [("stderr output", e) for e in seen.get("stderr", [])]
    found += [("broken image", src) for src in seen["broken_images"]]
    found += [("broken link", url) for url in dict.fromkeys(seen["links"]) if _missing_local(url)]
    found += [("external request", url) for url in dict.fromkeys(requests + seen["resources"]) if _external(url)]
    return found


def source_notebook(page: Path) -> Path | None:
    """The downloadable notebook of a built page (``<html>/_sources/<page path>.ipynb``), or None."""
    page = Path(page).resolve()
    for root in page.parents:
        found = root / "_sources" / page.relative_to(root).with_suffix(".ipynb")
        if found.is_file():
            return found
    return None


def notebook_stderr(notebook: Path) -> list[str]:
    """Each stderr stream among the outputs of an executed notebook, as ``"cell N: text"``."""
    try:
        cells = json.loads(Path(notebook).read_text()).get("cells", [])
    except (OSError, ValueError):
        return []
    return [f"in {Path(notebook).name}, cell {i}: " + "".join(out.get("text", "")).strip()[:120]
            for i, cell in enumerate(cells, 1) for out in cell.get("outputs", [])
            if out.get("output_type") == "stream" and out.get("name") == "stderr"]


def check_pages(pages: list[Path], screenshots: Path | None = None, browser: str | None = None,
                log=lambda *_: None) -> list[PageReport]:
    """Open each page in one headless Chromium and report its defects; screenshots to ``screenshots``."""
    reports = []
    with Chromium(browser) as b:
        for page in pages:
            page = Path(page).resolve()
            b.open(page.as_uri())
            seen = b.evaluate(READ_PAGE)
            r = PageReport(page, _defects(seen, b.requests), seen["math"], seen["images"])  # loading + scripts
            source = source_notebook(page)
            r.defects += [("stderr output", e) for e in (notebook_stderr(source) if source else [])]
            if screenshots is not None:
                r.screenshots.append(b.screenshot(screenshots / f"{page.stem}-top.png"))
                for what in ("figure", "table"):
                    box = b.evaluate(f"({RECT})({json.dumps(SELECTORS[what])})") if seen[what] else None
                    if box and box["width"] > 0:
                        r.screenshots.append(b.screenshot(screenshots / f"{page.stem}-{what}.png", box))
            log(r)
            reports.append(r)
    return reports


def book_pages(html: Path = HTML) -> list[Path]:
    """The content pages of a built book (not the index redirect, search and general index)."""
    return sorted(p for p in html.rglob("*.html") if p.name not in NOT_PAGES and p != html / "index.html"
                  and not {"_static", "_sources"} & set(p.relative_to(html).parts))


def main(html: Path = HTML, screenshots: Path = SCREENSHOTS, log=print) -> int:
    """Check every page of the built book; 0 when no page has a defect, 1 when some do, 2 when it cannot run."""
    html = Path(html)
    pages = book_pages(html)
    if not (html / "book" / "chapters").is_dir() or not pages:
        log(f"check-pages: no built book in {html} (run `make book` first)")
        return 2

    def show(r: PageReport):
        state = "ok" if not r.defects else f"{len(r.defects)} DEFECT(S)"
        log(f"{str(r.page.relative_to(html)):48s} {r.math:5d} formulas {r.images:3d} images  {state}")
        for kind, what in r.defects:
            log(f"    {kind}: {what}")

    screenshots = Path(screenshots)
    for old in screenshots.glob("*.png"):
        old.unlink()
    try:
        reports = check_pages(pages, screenshots, log=show)
    except BrowserError as e:
        log(f"check-pages: {e}")
        return 2
    bad = [r for r in reports if r.defects]
    shots = sum(len(r.screenshots) for r in reports)
    log(f"{len(reports)} pages checked in headless Chromium, network off: "
        + (f"{len(bad)} with defects" if bad else "no defects") + f"; {shots} screenshots in {screenshots}")
    return 1 if bad else 0
