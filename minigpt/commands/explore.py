"""`minigpt explore`: the lesson's explorable, served locally. One page (minigpt/explore/index.html,
shipped in the package, no build step, nothing fetched from elsewhere) and one JSON endpoint that
runs the same code as `minigpt trace --json` (with `--compare` when an intervention is set).

    GET  /              the page
    GET  /api/model     the model's shape, for the page's controls
    POST /api/trace     {"prompt" | "ids", "position", "scale": ["0.attention=0", ...],
                         "replace_residual": [...], "ablate_head": [...], "set_input": "2,2,2,2",
                         "at_position": false}  ->  trace.Trace or trace.Comparison as JSON

A refusal is a 400 with {"error": the one-line message `trace` prints, naming the request's fields
as the Python API names its arguments}; the server never stops on bad input. It binds to 127.0.0.1
unless --host says otherwise; Ctrl-C stops it.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

import typer

from ..api import Run
from ..errors import MinigptError
from .common import opened, user_errors
from .options import ExploreOptions

MAX_BODY = 1 << 16  # a request is a prompt and a few settings


def main(o: ExploreOptions) -> None:
    with user_errors():
        run = opened(o)
        page = resources.files("minigpt").joinpath("explore/index.html").read_bytes()
        try:
            server = ThreadingHTTPServer((o.host, o.port), _handler(Explorer(run), page))
        except OSError as exc:
            raise MinigptError(
                f"cannot serve on {o.host}:{o.port} ({exc.strerror or exc}); choose another --port"
            ) from None
    address = f"http://{o.host}:{server.server_address[1]}/"
    typer.echo(f"minigpt explore: {run.path} at {address} (Ctrl-C stops)", err=True)
    typer.echo(address)  # on stdout alone, for scripts
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("minigpt explore: stopped", err=True)
    finally:
        server.server_close()


class Explorer:
    """The page's requests, answered by the API's own trace (one at a time: the model and its
    recorder are not shared between threads). Refusals name the request's fields, as the API names
    its arguments."""

    def __init__(self, run: Run):
        self.run = run
        self.lock = threading.Lock()

    def model_info(self) -> dict[str, Any]:
        cfg = self.run.model.cfg
        return {
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_embd": cfg.n_embd,
            "context": cfg.context,
            "norm": cfg.norm,
            "activation": cfg.activation,
            "vocab_size": self.run.model.vocab_size,
            "prompt": self.first_prompt(),
        }

    def first_prompt(self) -> str:
        """What the page traces first: "ROMEO:" where the tokenizer can write it, else the first
        tokens of the vocabulary (a teaching model's a, b, c)."""
        tokenizer = self.run.tokenizer
        if not tokenizer.unknown_characters("ROMEO:"):
            return "ROMEO:"
        return tokenizer.decode(list(range(min(3, self.run.model.vocab_size))))

    def trace(self, request: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(request, dict):
            raise MinigptError("the request must be a JSON object")
        text, ids = request.get("prompt"), request.get("ids")
        position = request.get("position")
        if position is not None and not isinstance(position, int):
            raise MinigptError(f"position {position!r} is not an integer")
        with self.lock:
            return self.run.trace(
                None if text is None else str(text),
                ids=None if ids is None else str(ids),
                position=position,
                scale=_strings(request, "scale"),
                replace_residual=_strings(request, "replace_residual"),
                ablate_head=_strings(request, "ablate_head"),
                set_input=request.get("set_input") or None,
                at_position=bool(request.get("at_position")),
            ).as_dict()


def _strings(request: dict[str, Any], key: str) -> list[str]:
    value = request.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MinigptError(f'{key} must be a list of strings, e.g. ["0.attention=0"]')
    return value


def _handler(explorer: Explorer, page: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args) -> None:  # quiet: the terminal shows the address only
            pass

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, json.dumps(value).encode("utf-8"), "application/json")

        def do_GET(self) -> None:
            if self.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, page, "text/html; charset=utf-8")
            elif self.path == "/api/model":
                self._json(HTTPStatus.OK, explorer.model_info())
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no page at {self.path}"})

        def do_POST(self) -> None:
            if self.path != "/api/trace":
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no endpoint at {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= MAX_BODY:
                    raise MinigptError(f"the request body must be 1..{MAX_BODY} bytes of JSON")
                request = json.loads(self.rfile.read(length).decode("utf-8"))
                self._json(HTTPStatus.OK, explorer.trace(request))
            except MinigptError as exc:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            except (ValueError, UnicodeDecodeError) as exc:  # malformed JSON or headers
                self._json(HTTPStatus.BAD_REQUEST, {"error": f"malformed request: {exc}"})

    return Handler
