#!/usr/bin/env python3
"""Look at a ctrain run in TensorBoard the way users do, and check what renders.

Starts TensorBoard on a run directory (127.0.0.1, a free port), opens each dashboard in headless
Chromium (Debian's `chromium`) over the Chrome DevTools Protocol, waits (up to --timeout seconds
per dashboard) for its content, saves a PNG screenshot per dashboard in the output folder and
prints one line per dashboard, then a total:

  timeseries  the Time Series tab (TensorBoard's default) shows the scalar tags loss and
              samples_per_s, and draws charts
  scalars     the same on the older scalars dashboard
  graphs      the graph is laid out: SVG node labels for at least 3 of conv2d_0, dense,
              gradients, optimizer
  histograms  filtered to weights/: the tags (weights/conv2d_0/kernel, ...) and their charts
  text        the tag job shows the job's YAML as code: a pre/code element holds "seed", and no
              h1 heading appears (a "# comment" read as Markdown would make one)
  profile     the profile plugin (an iframe) shows a session and a host of plugins/profile/
              SESSION/HOST.xplane.pb, the Overview Page tool and its Performance Summary

The page's text is read deeply: shadow roots (Polymer) and same-origin iframes included. Without
RUN_DIR it first trains a short profiled run of examples/fashion_mnist_cnn.yaml in a temporary
folder. Exit status: 0 when every dashboard passed, 1 when one failed, 2 when the setup failed
(no chromium, TensorBoard did not start, ...). A developer's tool, not a test; run it from the
repository root with the build's virtual environment (TensorBoard and the profile plugin):

  build-venv/bin/python scripts/look/tensorboard_dashboards.py [RUN_DIR] [--out DIR]
"""
import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CTRAIN = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "coordinator", "ctrain")
TENSORBOARD = os.path.join(os.path.dirname(sys.executable), "tensorboard")


class Failure(Exception):
    """A setup step failed; its message is the one-line error printed."""


class PageError(Failure):
    """A DevTools command or page script failed (the connection itself is fine)."""


# ---------------------------------------------------------------- processes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, log_path, **kw):
    log = open(log_path, "wb")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **kw)
    finally:
        log.close()


def stop(proc, grace=0):
    """Ends a process we started and the children in its session (its own process group)."""
    if proc is None:
        return
    try:
        proc.wait(grace)  # it may be closing by itself
    except subprocess.TimeoutExpired:
        pass
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)  # the leader may be gone and its children not
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            return


def log_tail(path, n=5):
    try:
        with open(path, errors="replace") as f:
            return " | ".join(line.strip() for line in f.readlines()[-n:])
    except OSError:
        return ""


def wait_for(what, fn, timeout, proc=None, log=None):
    """Calls fn until it returns a true value; fails after timeout or when proc exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = fn()
            if value:
                return value
        except (OSError, ValueError, http.client.HTTPException):
            pass
        if proc is not None and proc.poll() is not None:
            raise Failure(f"{what}: process exited with {proc.returncode}: {log_tail(log)}")
        if time.monotonic() > deadline:
            raise Failure(f"{what}: not ready after {timeout:.0f} s: {log_tail(log)}")
        time.sleep(0.5)


# No proxy: every request goes to 127.0.0.1 directly, whatever http_proxy says.
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get_json(url, timeout=10):
    with LOCAL.open(url, timeout=timeout) as r:
        return json.loads(r.read())


def make_run(tmp):
    if not os.access(CTRAIN, os.X_OK):
        raise Failure(f"ctrain not found at {CTRAIN}: build it first (meson compile -C build)")
    run_dir = os.path.join(tmp, "run")
    cmd = [CTRAIN, "train", "examples/fashion_mnist_cnn.yaml", "--set", "train.max_steps=30",
           "--set", "logs.every_steps=5", "--set", "data.train.limit=2000",
           "--set", "data.eval.limit=500", "--profile", "5:10", "--quiet",
           "--set", f"run_dir={run_dir}"]
    print("training a short run:", " ".join(cmd[1:]), flush=True)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        said = (r.stderr or r.stdout).strip()[-400:]
        raise Failure(f"ctrain train failed ({r.returncode}): {said}")
    return run_dir


def start_tensorboard(run_dir, tmp, timeout):
    if not os.access(TENSORBOARD, os.X_OK):
        raise Failure(f"tensorboard not found next to {sys.executable}: run build-venv/bin/python")
    port = free_port()
    log = os.path.join(tmp, "tensorboard.log")
    proc = start([TENSORBOARD, "--logdir", run_dir, "--host", "127.0.0.1", "--port", str(port)],
                 log)
    base = f"http://127.0.0.1:{port}"

    def runs():
        return get_json(base + "/data/runs")

    try:
        wait_for("tensorboard", lambda: runs() is not None, timeout, proc, log)
        wait_for(f"tensorboard found no runs in {run_dir}", runs, 60, proc, log)
    except Failure:
        stop(proc)
        raise
    return proc, base


def find_chromium(path):
    for cand in [path] if path else ["/usr/bin/chromium", "chromium", "chromium-browser"]:
        found = shutil.which(cand)
        if found:
            return found
    raise Failure(f"chromium not found{' at ' + path if path else ''}: apt-get install chromium")


def start_chromium(binary, tmp, timeout):
    profile = os.path.join(tmp, "chromium-profile")
    log = os.path.join(tmp, "chromium.log")
    # Port 0: Chromium picks a free port and writes it to DevToolsActivePort (no race). Every
    # host but 127.0.0.1 is made unresolvable: the pages talk to TensorBoard only.
    proc = start([binary, "--headless=new", "--no-sandbox", "--disable-gpu",
                  "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                  "--disable-background-networking", "--disable-component-update",
                  "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                  "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                  f"--user-data-dir={profile}", "--window-size=1400,1000", "about:blank"], log)
    port_file = os.path.join(profile, "DevToolsActivePort")

    def page_ws():
        with open(port_file) as f:
            port = int(f.readline())
        pages = [t for t in get_json(f"http://127.0.0.1:{port}/json/list") if t["type"] == "page"]
        return pages and pages[0]["webSocketDebuggerUrl"]

    try:
        return proc, wait_for("chromium", page_ws, timeout, proc, log)
    except Failure:
        stop(proc)
        raise


# ---------------------------------------------------------------- DevTools protocol


class DevTools:
    """A minimal WebSocket client (RFC 6455) speaking the Chrome DevTools Protocol to one page."""

    def __init__(self, ws_url, timeout):
        hostport, _, path = ws_url[len("ws://"):].partition("/")
        host, _, port = hostport.rpartition(":")
        if host not in ("127.0.0.1", "localhost"):
            raise Failure(f"refusing to connect to {hostport}")
        self.sock = socket.create_connection(("127.0.0.1", int(port)), timeout=timeout)
        self.rfile = self.sock.makefile("rb")
        self.next_id = 0
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        status = self.rfile.readline()
        if b" 101 " not in status:
            raise Failure(f"websocket handshake refused: {status.strip().decode(errors='replace')}")
        while self.rfile.readline() not in (b"\r\n", b""):
            pass

    def close_browser(self):
        """Asks Chromium to quit (it then ends its own helper processes)."""
        try:
            self.sock.settimeout(10)
            self.call("Browser.close")
        except Failure:
            pass  # it may close the connection before answering
        self.sock.close()

    def _send_frame(self, opcode, payload):
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def _read(self, n):
        data = self.rfile.read(n)
        if len(data) != n:
            raise Failure("chromium closed the DevTools connection")
        return data

    def _recv_message(self):
        """Returns the next text message, answering pings and joining fragments."""
        parts = []
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:
                self._send_frame(0xA, payload)
            elif opcode == 0x8:
                raise Failure("chromium closed the DevTools connection")
            elif opcode in (0x0, 0x1, 0x2):
                parts.append(payload)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def call(self, method, **params):
        """Sends one command and returns its result; events arriving meanwhile are ignored."""
        self.next_id += 1
        try:
            self._send_frame(0x1, json.dumps({"id": self.next_id, "method": method,
                                              "params": params}).encode())
            while True:
                msg = json.loads(self._recv_message())
                if msg.get("id") == self.next_id:
                    break
        except socket.timeout:
            raise Failure(f"chromium did not answer {method} within {self.sock.gettimeout():.0f} s")
        except OSError as e:
            raise Failure(f"DevTools connection: {e}")
        if "error" in msg:
            raise PageError(f"{method}: {msg['error'].get('message')}")
        return msg["result"]

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                      awaitPromise=True)
        if "exceptionDetails" in r:
            raise PageError(f"page script failed: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))


# ---------------------------------------------------------------- what the page shows

# Collects the visible text of the page deeply: the document, every shadow root (Polymer) and
# every same-origin iframe (graph, profile), with SVG <text> and title attributes; plus the
# texts of pre/code and h1 elements and counts of the drawing elements.
PAGE_SCRIPT = r"""(() => {
  const out = {text: [], titles: [], code: [], h1: [], svgText: [], canvas: 0, svgPaths: 0,
               frames: [], errors: []};
  const skip = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE']);
  const shown = el => !el.checkVisibility || el.checkVisibility();
  function walk(root) {
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) walk(el.shadowRoot);
      if (el.tagName === 'IFRAME') {
        try {
          const doc = el.contentDocument;
          if (doc && doc.documentElement) { out.frames.push(doc.location.pathname); walk(doc); }
        } catch (e) { out.errors.push('iframe: ' + e.message); }
      }
      if (skip.has(el.tagName) || !shown(el)) continue;
      const tag = el.localName, t = el.getAttribute('title');
      if (t) out.titles.push(t);
      if (tag === 'pre' || tag === 'code') out.code.push(el.textContent);
      if (tag === 'h1') out.h1.push(el.textContent);
      if (tag === 'canvas') out.canvas++;
      if (tag === 'path' || tag === 'rect' || tag === 'ellipse') out.svgPaths++;
      if (tag === 'text' && el.namespaceURI === 'http://www.w3.org/2000/svg')
        out.svgText.push(el.textContent);
      for (const n of el.childNodes)
        if (n.nodeType === 3 && n.nodeValue.trim()) out.text.push(n.nodeValue.trim());
    }
  }
  walk(document);
  out.text = out.text.join('\n');
  return out;
})()"""


def missing_words(text, words):
    return [w for w in words if w not in text]


def check_scalars(page, run):
    missing = missing_words(page["text"], ("loss", "samples_per_s"))
    if missing:
        return False, "scalar tags " + ", ".join(missing)
    if not page["canvas"] and not page["svgPaths"]:
        return False, "charts (no canvas, no SVG shapes)"
    return True, (f"tags loss, samples_per_s; charts: {page['canvas']} canvas, "
                  f"{page['svgPaths']} SVG shapes")


def check_graphs(page, run):
    labels = "\n".join(page["svgText"])  # the node labels the layout drew
    found = [w for w in ("conv2d_0", "dense", "gradients", "optimizer") if w in labels]
    if len(found) < 3:
        return False, f"graph nodes conv2d_0, dense, gradients, optimizer drawn as SVG " \
                      f"({len(page['svgText'])} SVG labels, found {found})"
    return True, f"{len(page['svgText'])} SVG labels, nodes {', '.join(found)}"


def check_histograms(page, run):
    tags = sorted({line for line in page["text"].splitlines()
                   if line.startswith("weights/") and line != "weights/"})
    if not tags:
        return False, "weights/... tags (weights/conv2d_0/kernel)"
    if not page["svgPaths"]:
        return False, "histogram charts (no SVG shapes)"
    example = "weights/conv2d_0/kernel" if "weights/conv2d_0/kernel" in tags else tags[0]
    return True, f"{len(tags)} weights/ tags ({example}, ...), {page['svgPaths']} SVG shapes"


def check_text(page, run):
    if "job" not in page["text"] or "seed" not in page["text"]:
        return False, "tag job with the job's YAML (\"seed\")"
    code = [c for c in page["code"] if "seed" in c]
    # The text plugin draws no h1 itself: one is a "# comment" of the YAML read as Markdown.
    heading = page["h1"] and f"; a comment became the heading {page['h1'][0].strip()[:60]!r}"
    if not code or heading:
        return False, "the job's YAML as code in a pre/code element" + (heading or "")
    return True, f"tag job, its YAML in a pre/code block ({len(code[0].splitlines())} lines)"


def check_profile(page, run):
    text = "\n".join([page["text"]] + page["titles"])
    if not run["hosts"]:
        return False, "a plugins/profile/SESSION/<host>-chief-0.xplane.pb file in the run directory"
    sessions = [s for s in run["sessions"] if s in text]
    hosts = [h for h in run["hosts"] if h in text]
    wanted = [("a session (" + ", ".join(run["sessions"]) + ")", sessions),
              ("a host (" + ", ".join(run["hosts"]) + ")", hosts),
              ("the Overview Page tool", "Overview Page" in text),
              ("its Performance Summary", "Performance Summary" in text)]
    missing = [what for what, ok in wanted if not ok]
    if missing:
        return False, ", ".join(missing)
    return True, f"session {sessions[0]}, host {hosts[0]}, Overview Page with its " \
                 "Performance Summary"


DASHBOARDS = [
    ("timeseries", "#timeseries", check_scalars),
    ("scalars", "#scalars", check_scalars),
    ("graphs", "#graphs", check_graphs),
    ("histograms", "#histograms&tagFilter=weights%2F", check_histograms),
    ("text", "#text", check_text),
    ("profile", "#profile", check_profile),
]


def profile_files(run_dir):
    """The sessions and hosts the profile plugin should list (SESSION/HOST.xplane.pb files)."""
    root = os.path.join(run_dir, "plugins", "profile")
    sessions = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))) \
        if os.path.isdir(root) else []
    hosts = sorted({f[:-len(".xplane.pb")] for d in sessions
                    for f in os.listdir(os.path.join(root, d)) if f.endswith(".xplane.pb")})
    return {"sessions": sessions, "hosts": hosts}


def look(tools, base, dashboard, run, out_dir, timeout, dump=False):
    """Opens one dashboard, waits for its check to pass (or timeout), screenshots it."""
    name, fragment, check = dashboard
    deadline = time.monotonic() + timeout
    reload_at = time.monotonic() + timeout / 2  # once, in case TensorBoard was still loading
    ok, what, page = False, "the page did not load", None
    tools.call("Page.navigate", url="about:blank")
    tools.call("Page.navigate", url=f"{base}/{fragment}")
    while time.monotonic() < deadline:
        time.sleep(1)
        if reload_at and time.monotonic() > reload_at:
            tools.call("Page.reload", ignoreCache=True)
            reload_at = None
            continue
        try:
            page = tools.evaluate(PAGE_SCRIPT)
        except PageError as e:  # e.g. while the page is being replaced
            what = str(e)
            continue
        ok, what = check(page, run)
        if ok:
            time.sleep(2)  # let the charts finish drawing, then look again
            try:
                page = tools.evaluate(PAGE_SCRIPT)
                ok, what = check(page, run)
            except PageError as e:
                ok, what = False, str(e)
            break
    tools.screenshot(os.path.join(out_dir, f"{name}.png"))
    if dump and page is not None:
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(page, f, indent=1)
    if not ok and page is not None:
        shows = " | ".join(page["text"].split("\n"))[:200]
        what += f" (after {timeout:.0f} s the page shows: {shows!r})"
    return ok, what


# ---------------------------------------------------------------- main


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("run_dir", nargs="?", help="a ctrain run directory (default: train a short run)")
    p.add_argument("--out", help="folder for the screenshots (default: a new temporary folder)")
    p.add_argument("--timeout", type=float, default=60,
                   help="seconds to wait for each dashboard's content (default 60)")
    p.add_argument("--chromium", help="the browser to drive (default: /usr/bin/chromium)")
    p.add_argument("--only", help="comma-separated dashboards to look at (default: all of "
                   + ",".join(d[0] for d in DASHBOARDS) + ")")
    p.add_argument("--dump", action="store_true",
                   help="also save what each page showed (its deep text) as NAME.json")
    args = p.parse_args()
    names = [d[0] for d in DASHBOARDS]
    args.only = args.only.split(",") if args.only else names
    unknown = [n for n in args.only if n not in names]
    if unknown:
        p.error(f"unknown dashboard {', '.join(unknown)} (choose from {', '.join(names)})")
    if args.run_dir and not os.path.isdir(args.run_dir):
        p.error(f"no run directory {args.run_dir}")
    return args


def look_at_all(args, tmp):
    chromium = find_chromium(args.chromium)
    out_dir = os.path.abspath(args.out or tempfile.mkdtemp(prefix="ctrain-dashboards-"))
    os.makedirs(out_dir, exist_ok=True)
    print("screenshots:", out_dir, flush=True)
    run_dir = os.path.abspath(args.run_dir or make_run(tmp))
    run = profile_files(run_dir)
    tb = browser = tools = None
    try:
        tb, base = start_tensorboard(run_dir, tmp, 120)
        browser, ws_url = start_chromium(chromium, tmp, 60)
        tools = DevTools(ws_url, timeout=max(60, args.timeout))
        tools.call("Page.enable")
        passed = failed = 0
        for dashboard in DASHBOARDS:
            if dashboard[0] in args.only:
                ok, what = look(tools, base, dashboard, run, out_dir, args.timeout, args.dump)
                print(f"{'PASS' if ok else 'FAIL'} {dashboard[0]}: {what}", flush=True)
                passed, failed = passed + ok, failed + (not ok)
        print(f"{passed} passed, {failed} failed")
        return 0 if failed == 0 else 1
    finally:
        if tools:
            tools.close_browser()
        stop(browser, grace=5)
        stop(tb)


def on_sigterm(*_):
    print("terminated", file=sys.stderr)
    sys.exit(143)  # raises SystemExit here, so that the cleanup below runs


def main():
    args = parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    tmp = tempfile.mkdtemp(prefix="ctrain-look-")
    try:
        return look_at_all(args, tmp)
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
