"""Cockpit in the sandbox and Debian's Chromium driving it, for the Cockpit page's browser test.

The sandbox has a network of its own (only its loopback), so Cockpit's port 9090 is
out of the host's reach.  ``PortForward`` brings it over: it listens on a port of the
host's loopback and, for each connection, opens one to 127.0.0.1:9090 *inside* the
container, from a thread that entered the container's network namespace (a socket
stays in the namespace it was created in; ``setns`` of a network namespace changes the
calling thread only).  Cockpit then sees a connection from its own loopback, which it
serves over plain HTTP.  Chromium and chromedriver run on the host, started by selenium
and stopped by pid.

``install_page`` puts this checkout's page where Cockpit finds it, with the chart
library's files linked as the packages link them (debian/flexiqd.links): building the
.deb takes minutes, test_packages.py checks that the .deb carries the same files.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .sandbox import Sandbox

REPO = Path(__file__).resolve().parents[2]
PAGE_SOURCE = REPO / "cockpit"
PAGE_DIR = "/usr/share/cockpit/flexiqd"
# The chart library's files the page loads, and where the packages link them from.
LIBRARY_LINKS = {
    f"{PAGE_DIR}/dygraph.min.js": "/usr/share/javascript/dygraphs/dygraph.min.js",
    f"{PAGE_DIR}/dygraph.min.css": "/usr/share/javascript/dygraphs/dygraph.min.css",
}
COCKPIT_PORT = 9090
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
_CLONE_NEWNET = 0x40000000


def unavailable_reason() -> str | None:
    """Why the browser test cannot run here (a package is missing), or None."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER, "/usr/lib/cockpit/cockpit-ws",
                                 "/usr/bin/cockpit-bridge", "/usr/share/cockpit/shell/manifest.json",
                                 LIBRARY_LINKS[f"{PAGE_DIR}/dygraph.min.js"])
               if not os.path.exists(path)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium module")
    if missing:
        return ("the Cockpit browser test needs chromium, chromium-driver, python3-selenium, "
                "cockpit-ws, cockpit-bridge, cockpit-system and libjs-dygraphs (make deps); missing: "
                + ", ".join(missing))
    return None


def install_page(sbx: Sandbox) -> None:
    """Copy the page into the container's /usr/share/cockpit/flexiqd and link the library."""
    # The checkout is at the same path inside the container.
    sbx.run(["rm", "-rf", PAGE_DIR])
    sbx.run(["install", "-d", "-m", "0755", PAGE_DIR])
    files = sorted(str(path) for path in PAGE_SOURCE.iterdir() if path.is_file())
    sbx.run(["install", "-m", "0644", *files, PAGE_DIR])
    for link, target in LIBRARY_LINKS.items():
        sbx.run(["ln", "-sfn", target, link])


def start_cockpit(sbx: Sandbox) -> None:
    sbx.systemctl("start", "cockpit.socket")
    sbx.wait_for(lambda: sbx.run(["curl", "-fsS", "-o", "/dev/null", f"http://127.0.0.1:{COCKPIT_PORT}/"],
                                 check=False).returncode == 0, 30, what="cockpit-ws to answer on 9090")


def add_user(sbx: Sandbox, name: str, password: str, groups: tuple[str, ...] = ()) -> None:
    """A local user with a home (Cockpit's session wants one) and a password for its login page."""
    extra = ["--groups", ",".join(groups)] if groups else []
    if sbx.run(["getent", "passwd", name], check=False).returncode != 0:
        sbx.run(["useradd", "--create-home", *extra, name])
    sbx.run(["chpasswd"], input=f"{name}:{password}\n")


class PortForward:
    """``127.0.0.1:<port>`` on the host, forwarded to ``127.0.0.1:<target>`` in a container.

    ``start()`` returns at once; each connection is carried by a thread of its own
    until either side closes.  ``stop()`` closes the listener and every connection.
    """

    def __init__(self, netns_pid: int, target: int) -> None:
        self.netns_pid = netns_pid
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def start(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"forward-{self.port}", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            sockets = [self._listener, *self._sockets] if self._listener else list(self._sockets)
            self._sockets.clear()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed by stop()
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        try:
            inside = self._connect_inside()
        except OSError:
            client.close()
            return
        with self._lock:
            if self._stopped.is_set():
                client.close()
                inside.close()
                return
            self._sockets.update((client, inside))
        try:
            _pump(client, inside)
        finally:
            with self._lock:
                self._sockets.difference_update((client, inside))
            client.close()
            inside.close()

    def _connect_inside(self) -> socket.socket:
        # This thread enters the container's network namespace for good: it is the
        # connection's own thread, and only sockets it creates from now on live there.
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/proc/{self.netns_pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into the network namespace of pid {self.netns_pid}: "
                                   f"{os.strerror(err)}")
        finally:
            os.close(fd)
        return socket.create_connection(("127.0.0.1", self.target), timeout=10)


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions ended (or a socket failed)."""
    for sock in (a, b):
        sock.setblocking(False)
    peer = {a: b, b: a}
    open_reads = {a, b}
    with selectors.DefaultSelector() as selector:
        for sock in open_reads:
            selector.register(sock, selectors.EVENT_READ)
        while open_reads:
            for key, _ in selector.select(timeout=1.0):
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not data:
                    selector.unregister(sock)
                    open_reads.discard(sock)
                    with contextlib.suppress(OSError):
                        peer[sock].shutdown(socket.SHUT_WR)
                    continue
                try:
                    peer[sock].setblocking(True)
                    peer[sock].sendall(data)
                    peer[sock].setblocking(False)
                except OSError:
                    return
            if a.fileno() < 0 or b.fileno() < 0:
                return


class Browser:
    """Headless Chromium under chromedriver, both started here and stopped by pid.

    ``driver`` is selenium's WebDriver.  ``stop()`` quits it, then kills whatever of
    chromedriver's process tree (chromium and its helpers) is still there.
    """

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self._profile = tempfile.mkdtemp(prefix="flexiq-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--disable-background-networking",
                    f"--window-size={width},{height}", f"--user-data-dir={self._profile}",
                    "--lang=en-US"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self._service = Service(executable_path=CHROMEDRIVER)
        self.driver = None
        self._pids: set[int] = set()
        try:
            self.driver = webdriver.Chrome(service=self._service, options=options)
        except BaseException:
            self.stop()
            raise
        self._pids = _descendants(self._service.process.pid) | {self._service.process.pid}

    def stop(self) -> None:
        driver, self.driver = self.driver, None
        process = getattr(self._service, "process", None)
        if process is not None:
            self._pids |= _descendants(process.pid) | {process.pid}
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()
        with contextlib.suppress(Exception):
            self._service.stop()
        for pid in sorted(self._pids):
            if _alive_and_ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if process is not None:
            with contextlib.suppress(Exception):
                process.wait(timeout=5)
        shutil.rmtree(self._profile, ignore_errors=True)

    def console_errors(self) -> list[str]:
        """The page's console messages of level SEVERE since the last call."""
        try:
            entries = self.driver.get_log("browser")
        except Exception:  # noqa: BLE001 -- a log we cannot read is no failure of the page
            return []
        return [entry["message"] for entry in entries if entry.get("level") == "SEVERE"]


class CockpitPage:
    """flexiqd's page in Cockpit's shell, as ``user`` sees it, in a browser of its own.

    ``open()`` logs in on Cockpit's login page and opens ``/flexiqd``; afterwards
    every call works inside the page's frame.  ``stop()`` ends the browser.
    """

    def __init__(self, port: int, user: str, password: str, *, height: int = 1000) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.user = user
        self.password = password
        self.browser = Browser(height=height)
        self.driver = self.browser.driver

    def stop(self) -> None:
        self.browser.stop()

    def login(self) -> None:
        d = self.driver
        d.get(self.base + "/")
        # The inputs are in the page before its script shows them (a loaded machine: seconds).
        wait_until(lambda: [e for e in d.find_elements("id", "login-user-input") if e.is_displayed() and e.is_enabled()],
                   30, what="Cockpit's login page")
        d.find_element("id", "login-user-input").send_keys(self.user)
        d.find_element("id", "login-password-input").send_keys(self.password)
        d.find_element("id", "login-button").click()
        wait_until(lambda: d.find_elements("css selector", "iframe[name^='cockpit1:localhost/']"), 30,
                   what=f"Cockpit's shell after {self.user} logged in")

    def open(self, timeout: float = 60) -> float:
        """Open the page in the shell; return the page's own load time in ms (navigation to ready).
        A loaded machine has taken over 30 s to show the shell's frame (once, with 20 pools)."""
        d = self.driver
        d.switch_to.default_content()
        d.get(self.base + "/flexiqd")
        frame = wait_until(lambda: d.find_elements("css selector", "iframe[name='cockpit1:localhost/flexiqd']"),
                           timeout, what="the flexiqd page's frame")[0]
        d.switch_to.frame(frame)
        ready = wait_until(lambda: d.execute_script("return document.documentElement.dataset.ready || ''"),
                           timeout, what="the flexiqd page to be ready")
        assert ready == "true", f"the page did not load: {self.text('#not-running')!r}"
        return float(d.execute_script("return document.documentElement.dataset.loadedMs"))

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def js_async(self, script: str, *args: Any, timeout: float = 20) -> Any:
        """Run ``script`` whose last argument is a callback it calls with the result."""
        self.driver.set_script_timeout(timeout)
        return self.driver.execute_async_script(script, *args)

    def find(self, css: str):
        return self.driver.find_element("css selector", css)

    def finds(self, css: str) -> list:
        return self.driver.find_elements("css selector", css)

    def text(self, css: str) -> str:
        """The text of the first element ``css`` finds ("" when none), read in one script."""
        return self.js("const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css)

    def attribute(self, css: str, name: str) -> str | None:
        """An attribute of the first element ``css`` finds (None when there is none, or it has
        none), read in one script: a part of the page drawn again between a find and a read
        (the schedules' rows are, every 2 s) cannot leave the read holding a stale element."""
        return self.js("const e = document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) : null",
                       css, name)

    def enabled(self, css: str) -> bool | None:
        """Whether the first control ``css`` finds is enabled (None: there is none), in one script."""
        return self.js("const e = document.querySelector(arguments[0]); return e ? !e.disabled : null", css)

    def click(self, css: str) -> None:
        from selenium.common.exceptions import StaleElementReferenceException

        for attempt in range(3):
            element = self.find(css)
            try:
                self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
                element.click()
                return
            except StaleElementReferenceException:
                # Drawn again between the find and the click (the schedules' rows are, every
                # 2 s): nothing was clicked; find it again.
                if attempt == 2:
                    raise

    def wait(self, predicate: Callable[[], Any], timeout: float = 20, *, what: str) -> Any:
        return wait_until(predicate, timeout, what=what)

    def wait_text(self, css: str, check: Callable[[str], Any], timeout: float = 20, *, what: str) -> str:
        """Wait until the text of ``css`` passes ``check``; return that text (which may be empty)."""
        seen: list[str] = []

        def passes() -> bool:
            seen.append(self.text(css))
            return bool(check(seen[-1]))

        try:
            wait_until(passes, timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the text of {css} was {seen[-1] if seen else None!r}") from None
        return seen[-1]

    def screenshot(self, path: Path, css: str | None = None) -> None:
        """The whole window (shell and page), with ``css`` in the page scrolled to the top first."""
        if css:
            self.js("arguments[0].scrollIntoView({block: 'start'})", self.find(css))
        self.driver.switch_to.default_content()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(path))
        finally:
            frame = self.driver.find_element("css selector", "iframe[name='cockpit1:localhost/flexiqd']")
            self.driver.switch_to.frame(frame)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive_and_ours(pid: int) -> bool:
    """A pid of chromium or chromedriver (not one reused by something else since)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return "chrom" in os.path.basename(exe)


@contextlib.contextmanager
def forwarded(sbx: Sandbox, port: int = COCKPIT_PORT) -> Iterator[PortForward]:
    forward = PortForward(sbx.leader, port)
    forward.start()
    try:
        yield forward
    finally:
        forward.stop()


def wait_until(predicate: Callable[[], Any], timeout: float, *, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last value: {value!r})")
