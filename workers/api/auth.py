"""Bearer tokens mapped to scopes, and the console's login session and CSRF tokens.

``EFFECTQ_API_TOKENS="ana:<token>:read,operate;shop:<token>:submit,read"``: each entry names
an actor (recorded in the audit stream for the operator calls it makes), its secret, and
its scopes — ``submit`` (tool calls, campaigns), ``read`` (effects, campaign status),
``operate`` (resolve, revoke, supersede, replay). A presented token is compared with every
configured one in constant time (HMAC digests of equal length, no early exit).

The console keeps no server-side state: its session cookie is ``NAME.EXPIRES.MAC`` with
the MAC keyed by that actor's own token, so rotating or removing a token ends its sessions,
and the browser never holds the token itself. A form's CSRF token is a second MAC of the
session cookie under the same key: a page of another site can neither read it nor (the
cookie being ``SameSite=Strict``) send the cookie at all.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from dataclasses import dataclass, field

__all__ = ["SCOPES", "ApiToken", "Tokens", "parse_tokens"]

SCOPES = ("submit", "read", "operate")
MIN_SECRET = 16
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_SECRET = re.compile(r"[A-Za-z0-9._~+/=-]+")


@dataclass(frozen=True)
class ApiToken:
    name: str
    secret: str = field(repr=False)
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return scope in self.scopes


def parse_tokens(text: str) -> tuple[ApiToken, ...]:
    """Parse ``NAME:TOKEN:SCOPE[,SCOPE]`` entries separated by ``;`` or newlines. Errors
    name the entry by its position, never its secret."""
    tokens: list[ApiToken] = []
    entries = [e.strip() for e in re.split(r"[;\n]", text) if e.strip()]
    for n, entry in enumerate(entries, 1):
        parts = entry.split(":")
        where = f"EFFECTQ_API_TOKENS entry {n}"
        if len(parts) != 3:
            raise ValueError(f"{where}: expected NAME:TOKEN:SCOPE[,SCOPE]")
        name, secret, scope_text = (p.strip() for p in parts)
        if not _NAME.fullmatch(name):
            raise ValueError(f"{where}: the name must be 1-64 of A-Z a-z 0-9 _ . @ -")
        if len(secret) < MIN_SECRET or not _SECRET.fullmatch(secret):
            raise ValueError(
                f"{where} ({name}): the token must be at least {MIN_SECRET} URL-safe characters"
            )
        scopes = frozenset(s.strip() for s in scope_text.split(",") if s.strip())
        unknown = sorted(scopes - set(SCOPES))
        if not scopes or unknown:
            raise ValueError(f"{where} ({name}): scopes are {', '.join(SCOPES)}; got {unknown}")
        if any(t.name == name for t in tokens):
            raise ValueError(f"{where}: the name {name!r} is used twice")
        if any(hmac.compare_digest(t.secret, secret) for t in tokens):
            raise ValueError(f"{where} ({name}): the same token is configured twice")
        tokens.append(ApiToken(name, secret, scopes))
    return tuple(tokens)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def _mac(token: ApiToken, *parts: str) -> str:
    message = "|".join(parts).encode("utf-8")
    return hmac.new(token.secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


class Tokens:
    """The configured tokens: bearer lookup, console sessions, CSRF tokens."""

    def __init__(self, tokens: tuple[ApiToken, ...], *, session_s: float) -> None:
        self._entries = [(_digest(t.secret), t) for t in tokens]
        self._by_name = {t.name: t for t in tokens}
        self.session_s = session_s

    def __bool__(self) -> bool:
        return bool(self._entries)

    def match(self, presented: str) -> ApiToken | None:
        """The token equal to ``presented``, compared with every entry in constant time."""
        digest = _digest(presented)
        found = None
        for expected, token in self._entries:
            if hmac.compare_digest(digest, expected):
                found = token
        return found

    def session(self, token: ApiToken, *, now: float | None = None) -> str:
        expires = str(int((time.time() if now is None else now) + self.session_s))
        return f"{token.name}.{expires}.{_mac(token, 'session', token.name, expires)}"

    def from_session(self, cookie: str, *, now: float | None = None) -> ApiToken | None:
        # Names may hold dots; the expiry and the MAC never do.
        head, _, mac = cookie.rpartition(".")
        name, _, expires = head.rpartition(".")
        token = self._by_name.get(name)
        if token is None or not expires.isdigit():
            return None
        if not hmac.compare_digest(mac, _mac(token, "session", name, expires)):
            return None
        if int(expires) < (time.time() if now is None else now):
            return None
        return token

    def csrf(self, token: ApiToken, cookie: str) -> str:
        return _mac(token, "csrf", cookie)

    def check_csrf(self, token: ApiToken, cookie: str, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.csrf(token, cookie).encode())
