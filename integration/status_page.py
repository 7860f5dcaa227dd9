#!/usr/bin/env python3
"""The debug port's status page in a real headless browser (Debian's chromium and
chromium-driver, selenium from PyPI), with JavaScript off: two Sluice peers, a key driven over
its limit shows in the hot keys as OVER, both peers show up; then one peer is killed and the
page, refreshing itself, shows it DOWN. Ends with `status page: N passed, M failed`.

A missing browser, driver or selenium fails the test under the test command and CI, and skips
it elsewhere (integration/tools.py). scripts/test.sh installs them."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import tools

tools.use_venv()

ROOT = Path(__file__).resolve().parent.parent
PASSED, FAILED = [], []


def check(name, ok, detail=""):
    (PASSED if ok else FAILED).append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if not ok and detail:
        print("     " + str(detail)[:3000].replace("\n", "\n     "))


def finish():
    print(f"status page: {len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


def skip_or_fail(what):
    failed = tools.missing("the status page test", [what])
    print(f"status page: 0 passed, {int(failed)} failed")
    sys.exit(int(failed))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what, fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if fn():
                return True
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def post_json(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/json", data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def main():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        skip_or_fail("selenium (pip install selenium; scripts/test.sh puts it in target/venv)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver") or (
        "/usr/lib/chromium/chromedriver" if Path("/usr/lib/chromium/chromedriver").exists() else None)
    if not chromium or not driver_bin:
        skip_or_fail("Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    sluice = os.environ.get("SLUICE_BIN") or str(target / "debug" / "sluice")
    if not Path(sluice).exists():
        subprocess.run(["cargo", "build", "-q", "--locked", "--bin", "sluice"], cwd=ROOT, check=True)

    tmp = tempfile.TemporaryDirectory()
    (Path(tmp.name) / "limits.yaml").write_text(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")
    nodes = [{"http": free_port(), "debug": free_port(), "peer": free_port(), "grpc": free_port()}
             for _ in range(2)]
    peers = ",".join(f"127.0.0.1:{n['peer']}" for n in nodes)
    procs = []
    try:
        for n in nodes:
            env = {"PATH": os.environ.get("PATH", ""), "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1",
                   "DEBUG_HOST": "127.0.0.1", "PORT": str(n["http"]), "GRPC_PORT": str(n["grpc"]),
                   "DEBUG_PORT": str(n["debug"]), "PEERS": peers, "PEER_PORT": str(n["peer"]),
                   "PEER_ADVERTISE_ADDRESS": f"127.0.0.1:{n['peer']}", "SLUICE_PEER_TIMEOUT_MS": "300"}
            procs.append(subprocess.Popen([sluice, "--config", tmp.name], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for n in nodes:
            wait("sluice to answer", lambda n=n: urllib.request.urlopen(
                f"http://127.0.0.1:{n['http']}/healthcheck", timeout=2).status == 200)
        body = '{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"tenant-1"}]}]}'
        statuses = [post_json(nodes[i % 2]["http"], body) for i in range(5)]
        check("a key driven over its limit through both peers", statuses == [200, 200, 200, 429, 429],
              statuses)

        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]:
            options.add_argument(arg)
        # No JavaScript: the page must work without it (and refresh itself by <meta>).
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
        browser = webdriver.Chrome(service=Service(driver_bin), options=options)

        def text_of(element_id):
            """An element's text now; "" while the page is between two refreshes (the element
            went stale, is not there yet, or Chrome's inspector lost the node: a refresh between
            finding it and reading it answers "Node with given id does not belong to the
            document", a plain WebDriverException, not a StaleElementReferenceException)."""
            from selenium.common.exceptions import WebDriverException
            for _ in range(20):
                try:
                    return browser.find_element("id", element_id).text
                except WebDriverException:
                    time.sleep(0.1)
            return ""

        try:
            browser.set_page_load_timeout(15)
            # The owner of the key has it hot; either node's page shows its peers.
            owner_page = None
            for n in nodes:
                browser.get(f"http://127.0.0.1:{n['debug']}/")
                if "d_k_tenant-1_" in browser.page_source:
                    owner_page = n
                    break
            check("the page loads, titled", browser.title == "Sluice status", browser.title)
            check("the over-limit key shows in the hot keys as OVER",
                  owner_page is not None and "OVER" in text_of("hot-keys"),
                  browser.page_source)
            watcher = owner_page or nodes[0]
            other = nodes[1] if watcher is nodes[0] else nodes[0]
            browser.get(f"http://127.0.0.1:{watcher['debug']}/")
            wait("both peers up on the page", lambda: text_of("peers").count("up") >= 2, timeout=20)
            check("both peers show up", True)
            check("the loaded limits are listed",
                  "d.k: unit=HOUR requests_per_unit=3" in text_of("limits"))
            # Kill the other peer; the page refreshes itself (no reload from here) and shows it down.
            procs[nodes.index(other)].kill()
            post_json(watcher["http"], '{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"x"}]}]}')
            addr = f"127.0.0.1:{other['peer']}"
            try:
                def shows_down():
                    rows = [r for r in text_of("peers").splitlines() if addr in r]
                    return any("DOWN" in r for r in rows)
                wait("the page to show the killed peer down", shows_down, timeout=40)
                check("a killed peer shows DOWN after the page refreshes itself", True)
            except AssertionError as e:
                check("a killed peer shows DOWN after the page refreshes itself", False, browser.page_source)
        finally:
            browser.quit()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    finish()


if __name__ == "__main__":
    main()
