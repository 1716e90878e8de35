"""`install` services on container nodes: an archive from the operator's file server (here a server on
127.0.0.1 the test runs, listed in the driver's install_sources) is unpacked inside the node as its user at
boot, before the execute services; a server not listed is refused at Provision, a redirect is not followed, an
archive over the size limit and one tar cannot read fail the boot naming the install."""

from __future__ import annotations

import http.server
import io
import tarfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from authority.substrate.container import lxc_missing
from protocol.messages import SliverSpec
from slicex.errors import BadArgs, ServerError
from tests.integration.netns_support import started_driver

NOW = datetime.now(UTC)


def _archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"hello from the file server\n"
        info = tarfile.TarInfo("tools/hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _Files(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes, dict]] = {}

    def do_GET(self):  # noqa: N802 - http.server's name
        code, body, headers = self.routes.get(self.path, (404, b"no", {}))
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def files():
    _Files.routes = {"/pub/tools.tgz": (200, _archive(), {}), "/pub/big.tgz": (200, b"x" * 300_000, {}),
                     "/pub/moved.tgz": (302, b"", {"Location": "http://127.0.0.1:1/pub/tools.tgz"}),
                     "/pub/garbage.tgz": (200, b"not a tar archive at all", {})}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def driver(files):
    if lxc_missing():
        pytest.skip("container nodes need: " + "; ".join(lxc_missing()))
    with started_driver(install_sources=[f"{files}/pub/"], install_max_bytes=200_000) as d:
        yield d


def _node(sliver: str, url: str, execute: str = "") -> SliverSpec:
    return SliverSpec(sliver, "node", "n1", details={
        "slice_urn": "urn:slice:inst", "cores": 1, "memory_mb": 256,
        "logins": [{"username": "alice", "urn": "urn:publicid:IDN+x+user+alice", "keys": []}],
        "install": [{"url": url, "install_path": "/local"}],
        "execute": [{"shell": "sh", "command": execute}] if execute else []})


def test_an_archive_is_unpacked_in_the_node_as_its_user_before_the_services_run(driver, files):
    spec = _node("urn:inst:ok", f"{files}/pub/tools.tgz", "stat -c %U /local/tools/hello.txt; cat /local/tools/hello.txt")
    st = driver.create(spec, NOW)
    st = driver.modify(spec, st, "geni_start", NOW)
    deadline = time.monotonic() + 60
    while (results := driver.view(spec, st)["execute"])[0]["state"] != "exited" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert results[0]["exit_code"] == 0 and results[0]["output"].split("\n")[:2] == [
        "alice", "hello from the file server"], results
    driver.destroy(spec, st, NOW)


@pytest.mark.parametrize("path,why", [("big.tgz", "larger than"), ("moved.tgz", "not followed"),
                                      ("garbage.tgz", "install service 1"), ("missing.tgz", "404")])
def test_a_bad_archive_fails_the_boot_naming_the_install(driver, files, path, why):
    spec = _node(f"urn:inst:{path}", f"{files}/pub/{path}")
    st = driver.create(spec, NOW)
    with pytest.raises(ServerError, match=why):
        driver.modify(spec, st, "geni_start", NOW)
    driver.destroy(spec, st, NOW)


def test_a_server_the_operator_did_not_list_is_refused_at_provision(driver, files):
    for url in (f"{files}/private/tools.tgz", "http://127.0.0.1:6379/pub/x.tgz", "file:///etc/shadow"):
        with pytest.raises(BadArgs, match="not on a file server"):
            driver.create(_node("urn:inst:refused", url), NOW)
    assert not Path(driver.lxcpath).exists() or not any(Path(driver.lxcpath).iterdir())
