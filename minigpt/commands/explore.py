"""`minigpt explore`: the lesson's explorable, served locally. One page (minigpt/explore/index.html,
shipped in the package, no build step, nothing fetched from elsewhere) and one JSON endpoint that
runs the same code as `minigpt trace --json` (with `--compare` when an intervention is set).

    GET  /              the page
    GET  /api/model     the model's shape and its stage names (stages.py), for the page's controls
    POST /api/trace     {"prompt" | "ids", "position", "scale": ["0.attention=0", ...],
                         "replace_residual": [...], "ablate_head": [...], "set_input": "2,2,2,2",
                         "at_position": false}  ->  trace.Trace or trace.Comparison as JSON

A refusal is a 400 with {"error": the same one-line message `trace` prints}; the server never
stops on bad input. It binds to 127.0.0.1 unless --host says otherwise; Ctrl-C stops it.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import typer

from .. import stages
from ..device import pick_device, use_threads
from ..errors import MinigptError
from ..run import load_model, reading_config
from ..trace import compare, prompt_ids, trace_position
from .common import user_errors
from .trace import parse_ids, parse_interventions

MAX_BODY = 1 << 16  # a request is a prompt and a few settings


def main(
    config: Path | None, run: Path | None, host: str, port: int, overrides: list[str], checkpoint: str = "last"
) -> None:
    with user_errors():
        cfg, run_dir = reading_config(config, run, overrides)
        use_threads(cfg.train.threads or 1)
        model, tokenizer = load_model(cfg, run_dir, pick_device(cfg.train.device), checkpoint)
        page = resources.files("minigpt").joinpath("explore/index.html").read_bytes()
        explorer = Explorer(model, tokenizer)
        try:
            server = ThreadingHTTPServer((host, port), _handler(explorer, page))
        except OSError as exc:
            raise MinigptError(
                f"cannot serve on {host}:{port} ({exc.strerror or exc}); choose another --port"
            ) from None
    address = f"http://{host}:{server.server_address[1]}/"
    typer.echo(f"minigpt explore: {run_dir} at {address} (Ctrl-C stops)", err=True)
    typer.echo(address)  # on stdout alone, for scripts
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("minigpt explore: stopped", err=True)
    finally:
        server.server_close()


class Explorer:
    """The page's requests, answered by the library's own trace code (one at a time: the model
    and its recorder are not shared between threads)."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.lock = threading.Lock()

    def model_info(self) -> dict[str, Any]:
        cfg = self.model.cfg
        return {
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_embd": cfg.n_embd,
            "context": cfg.context,
            "norm": cfg.norm,
            "norm_position": cfg.norm_position,
            "activation": cfg.activation,
            "vocab_size": self.model.vocab_size,
            "prompt": self.first_prompt(),
            # the page names its rows and its scale controls from these, never from its own list
            "stages": {
                "input": stages.INPUT,
                "block": list(stages.block_stages(cfg.norm_position)),
                "final": [stages.FINAL_NORM, stages.LOGITS],
                "scalable": list(stages.SCALABLE),
            },
        }

    def first_prompt(self) -> str:
        """What the page traces first: "ROMEO:" where the tokenizer can write it, else the first
        tokens of the vocabulary (a teaching model's a, b, c)."""
        if not self.tokenizer.unknown_characters("ROMEO:"):
            return "ROMEO:"
        return self.tokenizer.decode(list(range(min(3, self.model.vocab_size))))

    def trace(self, request: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(request, dict):
            raise MinigptError("the request must be a JSON object")
        text, ids = request.get("prompt"), request.get("ids")
        if (text is None) == (ids is None):
            raise MinigptError("give the tokens with exactly one of prompt or ids")
        interventions = parse_interventions(
            _strings(request, "scale"),
            _strings(request, "replace_residual"),
            _strings(request, "ablate_head"),
            request.get("set_input") or None,
        )
        position = request.get("position")
        if position is not None and not isinstance(position, int):
            raise MinigptError(f"position {position!r} is not an integer")
        with self.lock:
            token_ids = parse_ids(str(ids)) if ids is not None else prompt_ids(self.tokenizer, str(text))
            at_position = bool(request.get("at_position"))
            if interventions:
                return compare(
                    self.model,
                    self.tokenizer,
                    token_ids,
                    interventions,
                    position=position,
                    only_at_position=at_position,
                ).as_dict()
            return trace_position(self.model, self.tokenizer, token_ids, position=position).as_dict()


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
