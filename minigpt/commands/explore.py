"""`minigpt explore`: a run, looked at on a local page. The page (minigpt/explore/: HTML, CSS and
plain JavaScript shipped in the package, no build step, nothing fetched from elsewhere) draws what
explorer.py computes with the library's own code:

    GET  /                the page (and its /explore.css, /explore.js, /draw.js)
    GET  /api/model       the model's shape, its residual adds, the run's [sample] settings, and why
                          its logits cannot be attributed or patched (null: they can), or attributed
                          where a patch of each stage puts the clean value back
    POST /api/trace       {"prompt" | "ids", "position", "scale": ["0.attention=0", ...],
                           "replace_residual": [...], "ablate_head": [...], "set_input": "2,2,2,2",
                           "at_position": false, "attribute": TOKEN, "versus": TOKEN, "views": false,
                           "patch": {"clean": TEXT or ids, "block", "stage", "position", "head"},
                           "compare_run": false}
                          ->  trace.Trace or trace.Comparison as JSON (`minigpt trace --json [--compare]
                          [--attribute TOKEN --versus TOKEN]`; with "patch", Run.trace's `patch`; with
                          "compare_run": true, `--compare-run DIR` of the server's own --compare-run);
                          "views": true adds "views"
    POST /api/next        the same fields + "temperature", "top_k", "top_p"  ->  the next-token bars
    POST /api/step        {"prompt" | "ids", "greedy", "seed", "temperature", "top_k", "top_p"}  ->
                          the token `minigpt sample -n 1` appends
    POST /api/patch       {"clean", "corrupt": TEXT or ids, "answer", "versus": TOKEN (default: the clean
                          and the corrupt prompt's likeliest next tokens), "by": "stage" | "head"}  ->
                          what `minigpt patch --json` prints, and each token "spelled" for the page

A refusal is a 400 with {"error": the one-line message, naming the request's fields as the Python
API names its arguments}; the server never stops on bad input. Nobody else drives it: it binds to
127.0.0.1 unless --host says otherwise, and answers a request whose Host is not the address it
serves (DNS rebinding), or a POST whose Origin is another site, with a 403, so a page of another
site open in the same browser cannot use it. Ctrl-C stops it.
"""

from __future__ import annotations

import ipaddress
import json
import math
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

import typer

from ..errors import MinigptError
from ..explore.explorer import Explorer
from .common import compare_run_given, opened, say_notes, user_errors
from .options_inspect import ExploreOptions

MAX_BODY = 1 << 16  # a request is a prompt and a few settings
DRAINED = 1 << 20  # a larger body is still read, to be refused with an answer; past this, the connection is closed
FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/explore.css": ("explore.css", "text/css; charset=utf-8"),
    "/draw.js": ("draw.js", "text/javascript; charset=utf-8"),
    "/explore.js": ("explore.js", "text/javascript; charset=utf-8"),
}
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
WILDCARD = {"", "0.0.0.0", "::"}


def main(o: ExploreOptions) -> None:
    with user_errors():
        run = opened(o)
        given = compare_run_given(run, o.compare_run)
        compared = None if given is None else run.comparison_run(given)
        say_notes(run.notes)  # the compared run's learner's file
        folder = resources.files("minigpt").joinpath("explore")
        files = {path: (folder.joinpath(name).read_bytes(), kind) for path, (name, kind) in FILES.items()}
        handler = _handler(Explorer(run, compared), files)
        try:
            server = (Server6 if ":" in o.host else Server)((o.host, o.port), handler)
        except OSError as exc:
            raise MinigptError(
                "cannot serve on {host}:{port} ({reason}); choose another --port",
                host=o.host,
                port=o.port,
                reason=exc.strerror or exc,
            ) from None
    port = server.server_address[1]
    handler.served = Served(o.host, port)  # known once bound: --port 0 takes any free port
    address = f"http://{_bracketed(o.host)}:{port}/"
    beside = "" if compared is None else f", compared with {compared.path}"
    typer.echo(f"minigpt explore: {run.path}{beside} at {address} (Ctrl-C stops)", err=True)
    typer.echo(address)  # on stdout alone, for scripts
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("minigpt explore: stopped", err=True)
    finally:
        server.server_close()


class Server(ThreadingHTTPServer):
    # Ten clients connecting at once wait in the queue instead of having their connection dropped.
    request_queue_size = 64


class Server6(Server):
    address_family = socket.AF_INET6


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Served:
    """Which Host headers name this server: its address and port. Bound to the loopback, any of
    127.0.0.1, localhost and [::1]; bound to every address, any IP literal (a rebinding attack
    always comes by a DNS name) or localhost; otherwise the --host given."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host.lower(), port

    def names(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        name, _, port = host_header.strip().lower().rpartition(":")
        if not name or "]" in port:  # no port given (port 80 only), or a bare [v6] literal
            name, port = host_header.strip().lower(), "80"
        if port != str(self.port):
            return False
        name = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        if self.host in LOOPBACK:
            return name in LOOPBACK
        if self.host in WILDCARD:
            return name == "localhost" or _ip_literal(name)
        return name == self.host

    def origin(self, origin: str) -> bool:
        """An Origin header of this server's own page: http://HOST:PORT, with a Host it answers to."""
        return origin.lower().startswith("http://") and self.names(origin[len("http://") :])


def _ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Refused(Exception):
    """A request answered with its status and one line, before any model work."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def _handler(explorer: Explorer, files: dict[str, tuple[bytes, str]]) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()  # the model and its recorder answer one request at a time
    endpoints: dict[str, Callable[[Any], dict[str, Any]]] = {
        "/api/trace": explorer.trace,
        "/api/next": explorer.next_tokens,
        "/api/step": explorer.step,
        "/api/patch": explorer.patch,
    }

    class Handler(BaseHTTPRequestHandler):
        served: Served  # set once the server is bound
        timeout = 30  # a client that stops sending mid-request frees its thread

        def log_message(self, format: str, *args) -> None:  # quiet: the terminal shows the address only
            pass

        def _send(self, status: int, body: bytes, kind: str, seconds: float | None = None) -> None:
            self.send_response(status)
            if seconds is not None:  # the page shows how long the server took, beside its own times
                self.send_header("Server-Timing", f"compute;dur={1000 * seconds:.1f}")
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any, seconds: float | None = None) -> None:
            self._send(status, _strict_json(value).encode("utf-8"), "application/json", seconds=seconds)

        def _answer(self, respond: Callable[[], None]) -> None:
            try:
                if not self.served.names(self.headers.get("Host")):
                    raise Refused(
                        HTTPStatus.FORBIDDEN,
                        f"this server answers to its own address only, not Host {self.headers.get('Host')!r}",
                    )
                respond()
            except Refused as exc:
                self._json(exc.status, {"error": str(exc)})
            except MinigptError as exc:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            except (ValueError, UnicodeDecodeError) as exc:  # malformed JSON or headers
                self._json(HTTPStatus.BAD_REQUEST, {"error": f"malformed request: {exc}"})
            except (BrokenPipeError, ConnectionResetError):  # the client went away: nobody to answer
                pass
            except Exception as exc:  # a bug: answered, shown on the terminal, and the server keeps serving
                traceback.print_exc(file=sys.stderr)
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(exc).__name__}: {exc}"})

        def do_GET(self) -> None:
            self._answer(self._get)

        def do_POST(self) -> None:
            # The body is read before any refusal: a connection closed with unread data is reset,
            # and the client would lose the answer.
            declared = self.headers.get("Content-Length", "")
            length = int(declared) if declared.isdigit() else 0
            body = self.rfile.read(length) if 0 < length <= DRAINED else None
            if body is not None and len(body) > MAX_BODY:  # read only to be refused with an answer
                body = None
            self._answer(lambda: self._post(body))

        def _get(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/api/model":
                self._json(HTTPStatus.OK, explorer.model_info())
            elif path in files:
                self._send(HTTPStatus.OK, *files[path])
            else:
                raise Refused(HTTPStatus.NOT_FOUND, f"no page at {self.path}")

        def _post(self, body: bytes | None) -> None:
            origin = self.headers.get("Origin")
            if origin is not None and not self.served.origin(origin):
                raise Refused(HTTPStatus.FORBIDDEN, f"requests from another site ({origin}) are refused")
            answer = endpoints.get(self.path)
            if answer is None:
                raise Refused(HTTPStatus.NOT_FOUND, f"no endpoint at {self.path}")
            if body is None:
                raise MinigptError("the request body must be 1..{MAX_BODY} bytes of JSON", MAX_BODY=MAX_BODY)
            request = json.loads(body.decode("utf-8"))
            with lock:
                start = time.perf_counter()
                value = answer(request)
                encoded = _strict_json(value).encode("utf-8")
                seconds = time.perf_counter() - start
            self._send(HTTPStatus.OK, encoded, "application/json", seconds=seconds)

    return Handler


def _strict_json(value: Any) -> str:
    """JSON a browser parses: an infinite KL divergence (a token the intervention made impossible)
    travels as the string "Infinity", which JSON.parse would refuse as a bare number."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
