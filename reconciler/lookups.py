"""Provider lookup adapters: ask the provider whether an effect really happened.

``HttpLookup`` speaks the sandbox contract (``GET {base}/v1/effects/{key}``: 200 receipt,
404 not found) and is configurable for other providers by URL template, auth header and
timeouts. A lookup never raises for the provider's failures: it answers ``Unavailable``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import httpx

from dedupe import Found, LookupResult, NotFound, Unavailable

__all__ = ["HttpLookup"]


class HttpLookup:
    """Looks an effect up by its idempotency key over HTTP.

    ``url_template`` is formatted with ``key``; ``base_url`` may be a callable so that
    tools declared at import read the provider URL when the reconciler runs. ``auth_env``
    names an environment variable holding the value of the ``Authorization`` header.
    ``not_found`` statuses are authoritative answers; ``verify`` accepts a CA bundle path.
    ``lookup_concurrency``: how many lookups the reconciler sends the provider at once
    (tools sharing this lookup share the limit).
    """

    def __init__(
        self,
        base_url: str | Callable[[], str],
        *,
        url_template: str = "/v1/effects/{key}",
        auth_env: str | None = None,
        timeout_s: float = 5.0,
        verify: bool | str = True,
        not_found: tuple[int, ...] = (404,),
        send_token: bool = True,
        lookup_concurrency: int = 8,
    ) -> None:
        self._base_url = base_url
        self.url_template = url_template
        self.auth_env = auth_env
        self.timeout_s = timeout_s
        self.verify = verify
        self.not_found = not_found
        self.send_token = send_token
        self.lookup_concurrency = lookup_concurrency
        self._local = threading.local()

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None or getattr(self._local, "pid", None) != os.getpid():
            base = self._base_url() if callable(self._base_url) else self._base_url
            client = httpx.Client(base_url=base, timeout=self.timeout_s, verify=self.verify)
            self._local.client, self._local.pid = client, os.getpid()
        return client

    def lookup(self, idempotency_key: str, token: int | None = None) -> LookupResult:
        headers: dict[str, str] = {}
        if self.send_token and token is not None:
            # A fence-aware provider remembers the highest token: a paused holder that wakes
            # up after this takeover is refused (409) instead of executing.
            headers["Fencing-Token"] = str(token)
        if self.auth_env and (secret := os.environ.get(self.auth_env)):
            headers["Authorization"] = secret
        try:
            response = self._client().get(
                self.url_template.format(key=idempotency_key), headers=headers
            )
        except httpx.HTTPError as exc:
            return Unavailable(f"{type(exc).__name__}: {exc}"[:200])
        if response.status_code == 200:
            try:
                receipt = response.json()
            except ValueError:
                return Unavailable("lookup answered 200 with a body that is not JSON")
            if not isinstance(receipt, dict):
                return Unavailable("lookup answered 200 with a body that is not an object")
            return Found(receipt=receipt, raw=response.text)
        if response.status_code in self.not_found:
            return NotFound(authoritative=True)
        return Unavailable(f"lookup answered HTTP {response.status_code}")
