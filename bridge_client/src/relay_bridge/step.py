"""`relay-puppet-run`: the Relay `run` step. It asks the service for a Puppet run, waits for
a bridge to work it, and prints the step's outputs, `jobID` and `outcome`, as JSON.

It gives up (outcome `timed-out`, and asks the service to cancel the run) when no bridge
accepts the run within --accept-timeout, or, once the run is in progress, when the bridge
misses its heartbeats: when now is later than
`updated_at + timeoutAfterMissedHeartbeats * (next_update_before - updated_at)`.
The connection's token never goes on the command line, where `ps` shows it to every user:
it comes from --token-file, else $RELAY_CONNECTION_TOKEN, else the spec's `connection`
(`{relayAPIURL, token}`, what a `!Connection {type: puppet}` resolves to).
Exit status: 0 for `finished` or `success`; 1 for any other outcome; 2 for a bad spec or
configuration; 3 when the service could not be reached or refused the request."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from relay_bridge.api import ApiError, RelayClient

SUCCESS = ("finished", "success")


class SpecError(Exception):
    pass


@dataclass
class Clock:
    """Wall time and sleeping, replaceable in tests."""

    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    sleep: Callable[[float], None] = time.sleep


def run_body(spec: dict[str, Any]) -> dict[str, Any]:
    """The RFC's step spec (`noOp`, `evalTrace`, `scope` or `nodes`, …) as the API's body."""
    known = {
        "environment",
        "scope",
        "nodes",
        "noOp",
        "noop",
        "debug",
        "trace",
        "evalTrace",
        "evaltrace",
        "timeoutAfterMissedHeartbeats",
        "type",
        "name",
        "params",
        "targets",
        "connection",
    }
    unknown = sorted(set(spec) - known)
    if unknown:
        raise SpecError(f"unknown spec fields: {', '.join(unknown)}")
    body: dict[str, Any] = {}
    if spec.get("environment"):
        body["environment"] = spec["environment"]
    if "scope" in spec and "nodes" in spec:
        raise SpecError("give scope or nodes, not both")
    if "nodes" in spec:
        body["scope"] = {"nodes": spec["nodes"]}
    elif "scope" in spec:
        body["scope"] = spec["scope"]
    for ours, theirs in (
        ("noop", "noOp"),
        ("noop", "noop"),
        ("debug", "debug"),
        ("trace", "trace"),
        ("evaltrace", "evalTrace"),
        ("evaltrace", "evaltrace"),
    ):
        if theirs in spec:
            if not isinstance(spec[theirs], bool):
                raise SpecError(f"{theirs} must be true or false")
            body[ours] = spec[theirs]
    for field in ("type", "name", "params", "targets"):
        if field in spec:
            body[field] = spec[field]
    return body


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def wait(
    client: RelayClient, run: dict[str, Any], missed: int, accept_timeout: float, poll: float, clock: Clock
) -> dict[str, str]:
    """Follow the run to its end; returns the outputs {jobID, outcome}."""
    started = clock.now()
    while True:
        state = run["state"]
        if state["status"] == "complete":
            return {"jobID": state.get("job_id", ""), "outcome": state.get("outcome", "finished")}
        now = clock.now()
        if state["status"] == "in-progress" and state.get("next_update_before"):
            updated, due = _time(state["updated_at"]), _time(state["next_update_before"])
            late = now > updated + missed * (due - updated)
            why = f"the bridge missed {missed} heartbeats (last {state['updated_at']})"
        else:  # pending, or accepted and not started yet
            late = now > started + timedelta(seconds=accept_timeout)
            why = f"no bridge took the run within {accept_timeout:.0f} seconds"
        if late:
            print(f"relay-puppet-run: timed out: {why}; cancelling the run", file=sys.stderr)
            try:
                client.cancel(run["id"])
            except ApiError as exc:
                print(f"relay-puppet-run: could not cancel: {exc}", file=sys.stderr)
            return {"jobID": state.get("job_id", ""), "outcome": "timed-out"}
        clock.sleep(poll)
        run = client.get_run(run["id"])


def _spec_from(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if args.spec:
        try:
            text = Path(args.spec).read_text()
            loaded = json.loads(text) if args.spec.endswith(".json") else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise SpecError(f"--spec {args.spec}: {exc}") from None
        if not isinstance(loaded, dict):
            raise SpecError(f"--spec {args.spec}: must be a mapping")
        spec.update(loaded)
    flags = {
        "environment": args.environment,
        "nodes": args.nodes.split(",") if args.nodes else None,
        "noOp": args.noop,
        "debug": args.debug,
        "trace": args.trace,
        "evalTrace": args.evaltrace,
        "type": args.type,
        "name": args.name,
        "params": json.loads(args.params) if args.params else None,
        "targets": args.targets.split(",") if args.targets else None,
        "timeoutAfterMissedHeartbeats": args.timeout_after_missed_heartbeats,
    }
    spec.update({k: v for k, v in flags.items() if v is not None})
    return spec


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relay-puppet-run", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", help="a YAML or JSON file with the step's spec")
    p.add_argument("--environment")
    p.add_argument("--nodes", help="certnames, comma-separated")
    p.add_argument("--noop", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--debug", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--evaltrace", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--type", choices=["run", "task-run", "plan-run"])
    p.add_argument("--name", help="the task or plan")
    p.add_argument("--params", help="the task's or plan's parameters, as JSON")
    p.add_argument("--targets", help="a task's targets, comma-separated")
    p.add_argument("--timeout-after-missed-heartbeats", type=int)
    p.add_argument("--accept-timeout", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--poll-interval", type=float, default=5.0, help="seconds (default 5)")
    p.add_argument("--api-url", help="or RELAY_API_URL, or the spec's connection.relayAPIURL")
    # No --token: a token in argv is in `ps` for every user of the host. Refused with a
    # message rather than argparse's "unrecognized arguments", so the fix is obvious.
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("--token-file", help="a file holding the token (or RELAY_CONNECTION_TOKEN_FILE)")
    p.add_argument("--outputs-file", help="also write the outputs JSON here")
    return p


def _connection(args: argparse.Namespace, spec: dict[str, Any]) -> tuple[str, str]:
    """The service's URL and the connection's token: flags, then the environment, then the
    spec's `connection` (`{relayAPIURL, token}`, a resolved `!Connection`)."""
    connection = spec.get("connection") if isinstance(spec.get("connection"), dict) else {}
    url = args.api_url or os.environ.get("RELAY_API_URL") or connection.get("relayAPIURL")
    token_file = args.token_file or os.environ.get("RELAY_CONNECTION_TOKEN_FILE")
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise SpecError(f"--token-file {token_file}: {exc.strerror}") from None
    else:
        token = os.environ.get("RELAY_CONNECTION_TOKEN") or connection.get("token")
    if not isinstance(url, str) or not url:
        raise SpecError("--api-url (or RELAY_API_URL) is required")
    if not isinstance(token, str) or not token:
        raise SpecError("the connection's token is required: RELAY_CONNECTION_TOKEN or --token-file")
    return url, token


def main(argv: list[str] | None = None, clock: Clock | None = None) -> int:
    args = parser().parse_args(argv)
    if args.token is not None:
        print(
            "relay-puppet-run: --token is refused: `ps` shows it to every user of this host."
            " Set RELAY_CONNECTION_TOKEN or use --token-file.",
            file=sys.stderr,
        )
        return 2
    try:
        spec = _spec_from(args)
        url, token = _connection(args, spec)
        body = run_body(spec)
        missed = spec.get("timeoutAfterMissedHeartbeats", 3)
        if not isinstance(missed, int) or missed < 1:
            raise SpecError("timeoutAfterMissedHeartbeats must be a whole number, 1 or more")
    except (SpecError, ValueError) as exc:
        print(f"relay-puppet-run: {exc}", file=sys.stderr)
        return 2
    client = RelayClient(url, token)
    try:
        run = client.create_run(body)
        print(f"relay-puppet-run: run {run['id']} created; waiting for a bridge", file=sys.stderr)
        outputs = wait(client, run, missed, args.accept_timeout, args.poll_interval, clock or Clock())
    except ApiError as exc:
        print(f"relay-puppet-run: {exc}", file=sys.stderr)
        return 3
    finally:
        client.close()
    text = json.dumps(outputs)
    print(text)
    if args.outputs_file:
        Path(args.outputs_file).write_text(text + "\n")
    return 0 if outputs["outcome"] in SUCCESS else 1


def main_exit() -> None:
    sys.exit(main())
