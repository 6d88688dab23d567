"""Which web pages may use the server: the browser's `Origin` header, checked as Ollama does.

A page on any site can make the browser send a "simple" cross-site request (a form or
`text/plain` POST) without asking first, and a keyless local server would run it. So a request
that carries an `Origin` (browsers add it to cross-site requests, and to every POST) is served
only when that origin is this machine's loopback (http(s)://localhost, 127.x.x.x or [::1], any
port) or is on the allow-list (`--cors-origin`, repeatable; `*` allows every origin). Requests
without an `Origin` (curl, SDKs, other programs) are not browser requests and are unaffected.
Ollama ships the same rule (OLLAMA_ORIGINS, loopback by default); llama-server instead answers
any origin and relies on its API key, which a keyless server does not have.

Allowed origins get CORS headers, so a page on them can read the replies; a preflight (OPTIONS
with Access-Control-Request-Method) is answered 204 for them and 403 for any other origin.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response

from app.server.errors import ApiError

ANY = "*"
PREFLIGHT_MAX_AGE_S = 600  # browsers cache a preflight answer this long
ALLOWED_METHODS = "GET, POST, OPTIONS"


def is_loopback_name(name: str) -> bool:
    """A host name (no port, no brackets) that names this machine's loopback."""
    name = name.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: always loopback
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normalize_origin(origin: str) -> str | None:
    """`scheme://host[:port]` in lower case, or None when `origin` is not an http(s) origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.query or parts.fragment or parts.username or parts.password:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def parse_allowed_origins(values: Iterable[str]) -> tuple[str, ...]:
    """The --cors-origin values, normalized; ValueError (one line) for one that is no origin."""
    allowed = []
    for value in values:
        if value.strip() == ANY:
            allowed.append(ANY)
            continue
        origin = normalize_origin(value)
        if origin is None:
            raise ValueError(f"--cors-origin {value!r} is not an origin: give scheme://host[:port] "
                             "(e.g. http://localhost:3000) or *")
        allowed.append(origin)
    return tuple(dict.fromkeys(allowed))


def check_any_origin_has_key(origins: Iterable[str], api_key: str | None) -> None:
    """ValueError (one line) for * without a key: any web page the user visits could then read
    the server's replies and spend its compute."""
    if ANY in origins and not api_key:
        raise ValueError("--cors-origin * lets every web page you visit use this server: it needs an API key "
                         "(--api-key or --api-key-file); or name the origins that may (--cors-origin "
                         "http://localhost:3000)")


class OriginPolicy:
    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed = frozenset(parse_allowed_origins(allowed))

    def allows(self, origin: str) -> bool:
        if ANY in self.allowed:
            return True
        normalized = normalize_origin(origin)
        if normalized is None:  # "null" (sandboxed pages, file://) and anything malformed
            return False
        return normalized in self.allowed or is_loopback_name(urlsplit(normalized).hostname or "")

    @staticmethod
    def is_preflight(method: str, headers: Headers) -> bool:
        return method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers

    @staticmethod
    def refusal(origin: str) -> Response:
        shown = origin[:100]
        return ApiError(403, f"requests from the web page origin {shown!r} are not allowed; start the server "
                        "with --cors-origin ORIGIN to allow it", "forbidden_origin").response()

    @staticmethod
    def add_cors_headers(headers: MutableHeaders, origin: str) -> None:
        headers["Access-Control-Allow-Origin"] = origin
        headers["Access-Control-Expose-Headers"] = "Retry-After"
        headers.add_vary_header("Origin")

    def preflight(self, headers: Headers) -> Response:
        """The answer to an allowed origin's preflight (the caller has checked the origin)."""
        response = Response(status_code=204)
        self.add_cors_headers(response.headers, headers["origin"])
        response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
        # The origin is trusted: whatever headers its page sends (the OpenAI JS SDK sends several
        # x-stainless-* ones) may come.
        asked = headers.get("access-control-request-headers", "")
        response.headers["Access-Control-Allow-Headers"] = asked[:1000] or "Authorization, Content-Type"
        response.headers["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
        return response
