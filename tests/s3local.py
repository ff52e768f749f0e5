"""A real S3-compatible server on loopback for tests, and a proxy that injects faults.

``S3Server`` runs moto in server mode in a child process on 127.0.0.1 (a free port) and
stops it after. ``FaultProxy`` sits between a client and that server, forwarding HTTP
requests and, on a schedule, answering 500 or 503 (SlowDown), closing the connection
before answering, or cutting a response body short: the transient failures a loader
meets in object storage.
"""

from __future__ import annotations

import collections
import dataclasses
import http.client
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import boto3

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """``python -m moto.server`` on 127.0.0.1 in a child process."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **{k.upper(): v for k, v in CREDENTIALS.items()}}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url + "/moto-api/", timeout=1).read()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.1)

    def client(self, endpoint: str | None = None):
        return boto3.client(
            "s3", endpoint_url=endpoint or self.url, region_name=REGION, **CREDENTIALS
        )

    def reset(self) -> None:
        """Forget every bucket and object."""
        request = urllib.request.Request(self.url + "/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).read()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def upload_tree(client, bucket: str, local_root: str, prefix: str = "") -> list[str]:
    """Put every file under ``local_root`` as ``prefix/relative/path``; returns the keys."""
    keys = []
    for folder, _, files in os.walk(local_root):
        for name in sorted(files):
            path = os.path.join(folder, name)
            key = "/".join(p for p in (prefix, os.path.relpath(path, local_root)) if p)
            client.upload_file(path, bucket, key.replace(os.sep, "/"))
            keys.append(key)
    return sorted(keys)


class _QuietServer(http.server.ThreadingHTTPServer):
    """Says nothing when a client drops its connection (a DataLoader worker that ended)."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclasses.dataclass(frozen=True)
class Request:
    """One request a ``FaultProxy`` forwarded and answered.

    Attributes:
        rank: The N of a ``fmsdata-rank/N`` in its User-Agent (a client's
            ``config_kwargs={"user_agent_extra": ...}``), or -1.
        kind: ``LIST`` (a GET of a bucket with a listing query), ``GET``, ``HEAD``,
            ``PUT``, ``DELETE``, ``POST``.
        key: ``/bucket/key`` (a listing: ``/bucket``).
        prefix: The prefix a listing asked for ('' for the whole bucket); None otherwise.
        recursive: A listing without a delimiter: every key under the prefix, at any depth.
        bytes: Bytes of the answer's body (a HEAD: none).
    """

    rank: int
    kind: str
    key: str
    prefix: str | None
    recursive: bool
    bytes: int

    @classmethod
    def of(cls, method: str, path: str, headers, body: bytes) -> Request:
        parts = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        key = parts.path.rstrip("/") or "/"
        bucket_only = key.count("/") == 1
        listing = method == "GET" and bucket_only and ("list-type" in query or "prefix" in query)
        match = re.search(r"fmsdata-rank/(\d+)", headers.get("User-Agent", ""))
        return cls(
            rank=int(match.group(1)) if match else -1,
            kind="LIST" if listing else method,
            key=key,
            prefix=query.get("prefix", [""])[0] if listing else None,
            recursive=listing and not query.get("delimiter", [""])[0],
            bytes=0 if method == "HEAD" else len(body),
        )


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that forwards to ``target`` and fails on a schedule.

    Args:
        target: ``http://host:port`` of the real server.
        faults: Faults to cycle through, one per request whose number is a multiple of
            ``every``: ``"500"``, ``"503"``, ``"drop"`` (close without answering),
            ``"cut"`` (send half of the body, then close) or ``"flip"`` (change a byte of
            a ranged object read: corruption only a checksum catches).
        every: Fail one request in this many (GET and HEAD only; others pass).
        delay: Seconds to wait before answering each GET (a slow link).
        hold: A PUT whose path contains this is stopped half way: the proxy reads half of
            its body, sets ``held`` and waits for ``release``, then drops the connection
            without forwarding anything (a client killed in the middle of an upload).

    ``gets`` counts the GET requests by URL path (``/bucket/key``, query left out): how
    often each object was read, as the server sees it. ``log`` records every request
    answered (``Request``: who sent it, its kind, key, listed prefix, body bytes).
    """

    def __init__(
        self,
        target: str,
        faults: tuple[str, ...] = (),
        every: int = 3,
        delay: float = 0.0,
        hold: str | None = None,
    ):
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.faults = faults
        self.every = every
        self.delay = delay
        self.requests = 0
        self.gets: collections.Counter[str] = collections.Counter()
        self.injected: dict[str, int] = {}
        self.log: list[Request] = []
        self.fail_all = False
        self.hold = hold
        self.held = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if proxy.hold and self.command == "PUT" and proxy.hold in self.path:
                    self.rfile.read(length // 2)
                    proxy.held.set()
                    proxy.release.wait(300)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                body = self.rfile.read(length) if length else None
                fault = proxy._next_fault(self.command, self.path)
                if proxy.delay and self.command == "GET":
                    time.sleep(proxy.delay)
                if fault == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault in ("500", "503"):
                    code = "InternalError" if fault == "500" else "SlowDown"
                    payload = f"<Error><Code>{code}</Code><Message>injected</Message></Error>"
                    data = payload.encode()
                    self.send_response(int(fault))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                    return
                upstream = http.client.HTTPConnection(*proxy.target, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = f"{proxy.target[0]}:{proxy.target[1]}"
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                except OSError:
                    # The server went away (a test stopped it): the client sees a reset.
                    self.close_connection = True
                    return
                finally:
                    upstream.close()
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # A HEAD answer has no body but tells the length of the one GET would get.
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if fault == "cut" and self.command == "GET" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "flip" and self.headers.get("Range") and data:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                if self.command != "HEAD":
                    self.wfile.write(data)
                with proxy._lock:
                    proxy.log.append(Request.of(self.command, self.path, self.headers, data))

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _next_fault(self, method: str, path: str) -> str | None:
        if method not in ("GET", "HEAD"):
            return None
        with self._lock:
            self.requests += 1
            if method == "GET":
                self.gets[urllib.parse.urlsplit(path).path] += 1
            if self.fail_all:
                fault = "503"
            elif not self.faults or self.requests % self.every:
                return None
            else:
                fault = self.faults[(self.requests // self.every) % len(self.faults)]
            self.injected[fault] = self.injected.get(fault, 0) + 1
            return fault

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
