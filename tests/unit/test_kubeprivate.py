"""The Kubernetes client's internals that sandlot uses, named: if an upgrade of
``kubernetes`` moves one, a test here fails saying which, and no other module of
the package reaches past ``adapters/kubeprivate.py`` to them."""

from __future__ import annotations

import contextlib
import inspect
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import urllib3
from kubernetes import client
from kubernetes.client.rest import RESTClientObject

from sandlot.adapters import kubeprivate

PACKAGE = Path(kubeprivate.__file__).resolve().parents[1]
PRIVATE = re.compile(r"\brest_client\b|\biter_resp_lines\b|\bsanitize_for_serialization\b")


def test_the_rest_clients_request_takes_what_the_wrapper_and_the_patcher_pass() -> None:
    params = inspect.signature(RESTClientObject.request).parameters
    for name in ("method", "url", "headers", "body", "_request_timeout"):
        assert name in params, f"RESTClientObject.request lost its {name!r} parameter"
    api = client.ApiClient(client.Configuration())
    assert kubeprivate.request_of(api) == api.rest_client.request


def test_an_installed_request_receives_every_call_of_the_generated_client() -> None:
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    seen: list[tuple[str, str]] = []

    class Answered(Exception):
        pass

    def request(method: str, url: str, *args: object, **kwargs: object) -> object:
        seen.append((method, url.split("?", 1)[0]))
        raise Answered

    kubeprivate.install_request(api, request)
    with contextlib.suppress(Answered):
        client.CoreV1Api(api).read_namespace("x")
    assert seen == [("GET", "http://127.0.0.1:9/api/v1/namespaces/x")]


def test_watch_lines_splits_a_real_http_response_by_line() -> None:
    body = b'{"type":"ADDED"}\n{"type":"BOOKMARK"}\n'

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in (body[:20], body[20:]):  # a line split across chunks
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.handle_request, daemon=True).start()
    try:
        response = urllib3.PoolManager().request(
            "GET",
            f"http://127.0.0.1:{server.server_port}/",
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=5),
            retries=False,
        )
        assert list(kubeprivate.watch_lines(response)) == [
            '{"type":"ADDED"}',
            '{"type":"BOOKMARK"}',
        ]
    finally:
        server.server_close()


def test_to_json_gives_the_api_servers_field_names() -> None:
    api = client.ApiClient(client.Configuration())
    meta = client.V1ObjectMeta(name="n", resource_version="7", owner_references=[])
    assert kubeprivate.to_json(api, meta) == {
        "name": "n",
        "resourceVersion": "7",
        "ownerReferences": [],
    }


def test_no_other_module_reaches_into_the_clients_internals() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "kubeprivate.py" and "/gen/" not in path.as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert PACKAGE.joinpath("adapters", "kubeprivate.py").exists()
    assert not offenders, (
        f"the client's internals used outside adapters/kubeprivate.py: {offenders}"
    )
