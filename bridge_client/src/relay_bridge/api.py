"""The one place that talks to the Relay service's `/_puppet/runs` API (and the bridge's
`/_puppet/inventory` extension).

Every call carries the connection token (Bearer), and X-Relay-Platform / X-Relay-Backend so
the service knows what this bridge can run. Network errors and 5xx answers are retried with
capped exponential backoff and full jitter; a 4xx is the caller's to handle (ApiError)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import requests

from relay_bridge import __version__, metrics, trust
from relay_bridge.logs import logger


class ApiError(Exception):
    """The service answered 4xx (or kept failing): status, and its problem body if any."""

    def __init__(self, status: int, problem: dict[str, Any] | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.problem = problem or {}


class RelayClient:
    def __init__(
        self,
        api_url: str,
        token: str,
        platform: str = "",
        backend: str = "",
        proxy_url: str | None = None,
        attempts: int = 6,
        backoff: float = 0.5,
        backoff_cap: float = 30.0,
        timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base = api_url.rstrip("/") + "/_puppet/"
        self.session = requests.Session()
        self.session.headers.update(
            {
                "Authorization": f"Bearer {token}",
                "User-Agent": f"relay-bridge/{__version__}",
                "Accept": "application/json",
            }
        )
        if platform:
            self.session.headers["X-Relay-Platform"] = platform
        if backend:
            self.session.headers["X-Relay-Backend"] = backend
        # Given with each request: a session's own proxies lose to http(s)_proxy in the
        # environment, and the configured proxy must carry every call, as the module's does.
        self.proxies = {"http": proxy_url, "https": proxy_url} if proxy_url else None
        self.attempts, self.backoff, self.backoff_cap = attempts, backoff, backoff_cap
        self.timeout, self.sleep = timeout, sleep
        self.refused: set[str] = set()  # listed runs refused and logged already (`serve` lists often)

    def __repr__(self) -> str:
        return f"RelayClient({self.base!r})"  # never the token

    def close(self) -> None:
        self.session.close()

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = None,
        resend: bool = True,
        attempts: int | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """`resend=False` for calls that must not be sent twice: a network error may come
        after the service acted. (A 5xx is retried: the service answers those before it acts.)"""
        last = "no answer"
        attempts = attempts or self.attempts
        for attempt in range(attempts):
            if attempt:
                logger.warning(
                    "service call failed; retrying",
                    extra={"fields": {"call": f"{method} {path}", "error": last}},
                )
                # Full jitter: many bridges coming back after an outage do not all hit at once.
                self.sleep(random.uniform(0, min(self.backoff_cap, self.backoff * 2**attempt)))  # noqa: S311
            try:
                answer = self.session.request(
                    method,
                    self.base + path,
                    json=body,
                    params=params or None,
                    timeout=timeout or self.timeout,
                    proxies=self.proxies,
                )
            except requests.RequestException as exc:
                metrics.api_error("network")
                last = f"{type(exc).__name__}: {exc}"
                if not resend:
                    break
                continue
            logger.debug(
                "service call", extra={"fields": {"call": f"{method} {path}", "status": answer.status_code}}
            )
            if answer.status_code >= 500:
                metrics.api_error("5xx")
                last = f"{answer.status_code} {answer.text[:200]}"
                continue
            if answer.status_code >= 400:
                if answer.status_code != 409:  # a lost race is no error
                    metrics.api_error("4xx")
                problem = _json(answer)
                detail = problem.get("detail") if isinstance(problem, dict) else None
                raise ApiError(
                    answer.status_code,
                    problem if isinstance(problem, dict) else None,
                    f"{method} {path}: {answer.status_code} {detail or answer.text[:200]}",
                )
            document = _json(answer)
            if isinstance(document, dict):
                return document
            # A proxy's error page, a truncated answer: not the service speaking. Try again.
            metrics.api_error("garbage")
            last = f"{answer.status_code} with a body that is not a JSON object: {answer.text[:200]!r}"
        raise ApiError(0, None, f"{method} {path}: gave up after {attempts} tries ({last})")

    def create_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "runs", spec, resend=False)  # sent twice, it would be two runs

    def cancel(self, run_id: str) -> dict[str, Any]:
        return self._call("POST", f"{_run_path(run_id)}/cancel")

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", _run_path(run_id))

    def list_runs(
        self, status: str | None = None, wait: int = 0, attempts: int | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {}
        if status:
            params["status"] = status
        if wait:
            params["wait"] = wait
        answer = self._call("GET", "runs", timeout=self.timeout + wait, attempts=attempts, **params)
        runs = answer.get("runs")
        if not isinstance(runs, list):
            raise ApiError(0, None, "GET runs: the answer has no list of runs")
        return [run for run in runs if self._run_ok(run)]

    def _run_ok(self, run: Any) -> bool:
        """A listed run the bridge may work: its id becomes a directory and a URL path, so
        anything but a UUID (`/etc`, `../..`) is refused here, before it reaches either,
        and logged the first time this client sees it."""
        if isinstance(run, dict) and trust.run_id_ok(run.get("id")):
            return True
        shown = trust.shown(run.get("id") if isinstance(run, dict) else run)
        if shown not in self.refused:
            if len(self.refused) < 1000:  # a service that invents ids must not grow this
                self.refused.add(shown)
            why = "its id is not a UUID" if isinstance(run, dict) else "it is not an object"
            logger.error(f"refusing a listed run: {why}", extra={"fields": {"id": shown}})
        return False

    def accept(self, run_id: str, lease_id: str | None = None) -> str | None:
        """The lease id when this bridge now holds the run; None when another one does."""
        lease_id = lease_id or str(uuid.uuid4())
        try:
            return self._call("POST", f"{_run_path(run_id)}/accept", {"lease_id": lease_id}).get(
                "lease_id", lease_id
            )
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise

    def put_state(
        self,
        run_id: str,
        state: dict[str, Any],
        lease_id: str | None = None,
        attempts: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        body = {**state, "lease_id": lease_id} if lease_id else state
        return self._call("PUT", f"{_run_path(run_id)}/state", body, timeout=timeout, attempts=attempts)

    # The inventory extension (relay_bridge.inventory): `/_puppet/inventory`.

    def inventory_status(self) -> dict[str, Any]:
        return self._call("GET", "inventory", attempts=2)

    def inventory_start(self, facts: list[str]) -> dict[str, Any]:
        answer = self._call("POST", "inventory/syncs", {"facts": facts})
        if not trust.run_id_ok(answer.get("id")):
            raise ApiError(0, None, "POST inventory/syncs: the answer has no sync id")
        return answer

    def inventory_page(self, sync_id: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
        return self._call("PUT", f"{_sync_path(sync_id)}/nodes", {"nodes": nodes})

    def inventory_end(
        self, sync_id: str, since: str | None = None, error: str | None = None
    ) -> dict[str, Any]:
        body = {"error": error} if error else {"since": since}
        return self._call("POST", f"{_sync_path(sync_id)}/done", body)

    def inventory_answers(self, answers: list[dict[str, Any]]) -> dict[str, Any]:
        return self._call("POST", "inventory/queries", {"answers": answers})


def _sync_path(sync_id: str) -> str:
    if not trust.run_id_ok(sync_id):
        raise ApiError(0, None, f"refusing a sync id that is not a UUID: {trust.shown(sync_id)}")
    return f"inventory/syncs/{sync_id}"


def _run_path(run_id: str) -> str:
    if not trust.run_id_ok(run_id):
        raise ApiError(0, None, f"refusing a run id that is not a UUID: {trust.shown(run_id)}")
    return f"runs/{run_id}"


def _json(answer: requests.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None
