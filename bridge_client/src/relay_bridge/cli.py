"""`relay-bridge`: the bridge daemon's command line.

  relay-bridge poll --once     list pending runs, fork a daemon per run, exit (systemd timer)
  relay-bridge serve           long-running, long-polls the service (systemd service)
  relay-bridge status          the runs this host holds, and their state
  relay-bridge inventory       send the node inventory from PuppetDB to the service, now
  relay-bridge systemd-units DIR   write the systemd units for this installation

The options (--config, --state-dir, …) go before or after the command. It runs with umask
077: what it writes under state_dir is nobody else's. Exit status 2 for invalid
configuration, naming the key."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from importlib import resources
from pathlib import Path

from relay_bridge import __version__, backends, config, logs, state
from relay_bridge.daemon import Server, install_signal_handlers, poll_once, sync_inventory
from relay_bridge.state import RunRecord

UNITS = ("relay-bridge.service", "relay-bridge-poll.service", "relay-bridge-poll.timer")


def global_options(p: argparse.ArgumentParser, default: object = None) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=default,
        help=f"YAML configuration (default {config.DEFAULT_PATH}, else {config.MODULE_PATH})",
    )
    p.add_argument("--api-url", dest="relay_api_url", default=default)
    p.add_argument("--token-file", dest="relay_connection_token_file", default=default)
    p.add_argument("--backend", choices=config.BACKENDS, default=default)
    p.add_argument("--state-dir", dest="state_dir", default=default)
    p.add_argument("--heartbeat-interval", dest="heartbeat_interval", type=float, default=default)
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=default,
        help="default info (debug when the configuration says `debug: true`)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relay-bridge", description="The bridge between Puppet and Relay.")
    p.add_argument("--version", action="version", version=f"relay-bridge {__version__}")
    global_options(p)
    # The same options after the command: suppressed defaults, so that they do not undo
    # what was given before it.
    after = argparse.ArgumentParser(add_help=False)
    global_options(after, argparse.SUPPRESS)
    commands = p.add_subparsers(dest="command", required=True)

    def add(name: str, **kwargs: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[after], **kwargs)

    poll = add("poll", help="work the pending runs, a daemon per run")
    poll.add_argument("--once", action="store_true", required=True, help="one round, then exit (for a timer)")

    serve = add("serve", help="run until SIGTERM, long-polling for runs")
    serve.add_argument("--max-concurrent", type=int, default=10, help="runs worked at once (default 10)")
    serve.add_argument("--wait", type=int, default=30, help="long-poll seconds (default 30, at most 60)")
    serve.add_argument(
        "--stop-timeout",
        type=float,
        default=60.0,
        help="on SIGTERM, seconds to let Puppet finish before stopping it (default 60)",
    )

    serve.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT/metrics")

    add("inventory", help="send the node inventory from PuppetDB (puppetdb_url) to the service, now")

    status = add("status", help="print the runs this host holds and their state")
    status.add_argument("--json", action="store_true", help="one JSON document per run")

    units = add("systemd-units", help="write this installation's systemd units to DIR")
    units.add_argument("directory", type=Path)
    return p


def write_units(directory: Path, executable: str, config_path: Path | None) -> list[Path]:
    """The shipped units, with ExecStart pointing at this installation's relay-bridge, and
    at the configuration given (none: the bridge looks for it as it always does)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in UNITS:
        text = resources.files("relay_bridge").joinpath("systemd", name).read_text()
        text = text.replace("@RELAY_BRIDGE@", executable)
        text = text.replace(" --config @CONFIG@", f" --config {config_path}" if config_path else "")
        target = directory / name
        target.write_text(text)
        target.chmod(0o644)  # systemd's files, whatever this process's umask
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Run documents, Puppet's output and Bolt's inventory are the bridge's alone, and so are
    # the files its ssh and Bolt children write: whatever umask it was started with.
    os.umask(0o077)
    logs.setup(args.log_level or "info")
    if args.command == "systemd-units":
        executable = shutil.which("relay-bridge") or sys.argv[0]
        for path in write_units(args.directory, str(Path(executable).absolute()), args.config):
            print(path)
        return 0
    overrides = {
        key: getattr(args, key)
        for key in (
            "relay_api_url",
            "relay_connection_token_file",
            "backend",
            "state_dir",
            "heartbeat_interval",
        )
    }
    if overrides["relay_connection_token_file"]:
        overrides["relay_connection_token"] = None
    try:
        settings = config.load(args.config, overrides=overrides)
        if settings.debug and not args.log_level:
            logs.logger.setLevel(logging.DEBUG)
        logs.logger.log(
            logging.INFO if args.command == "serve" else logging.DEBUG,
            "configuration read",
            extra={"fields": {"file": settings.source or "none (environment and flags)"}},
        )
        if args.command == "status":
            return print_status(settings.state_dir, args.json)
        backend = backends.make(settings)
        if args.command == "serve" and not 1 <= args.max_concurrent <= 1000:
            raise config.ConfigError("--max-concurrent", "must be from 1 to 1000")
        if args.command == "serve" and not 0 <= args.wait <= 60:
            raise config.ConfigError("--wait", "must be from 0 to 60 seconds")
        state.prepare(settings.state_dir)
    except config.ConfigError as exc:
        print(f"relay-bridge: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except state.StateDirError as exc:
        print(f"relay-bridge: invalid configuration: state_dir: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"relay-bridge: invalid configuration: state_dir: {exc.strerror}", file=sys.stderr)
        return 2

    if args.command == "inventory":
        if not settings.puppetdb_url:
            print("relay-bridge: invalid configuration: puppetdb_url: is not set", file=sys.stderr)
            return 2
        done = sync_inventory(settings, backend)
        if done is None:
            return 1
        kind = "full" if done.full else "incremental"
        print(f"{kind} sync: {done.nodes} nodes sent, {len(done.refused)} refused, {done.seconds:.1f} s")
        return 0
    if args.command == "poll":
        return 0 if poll_once(settings, backend, settings.heartbeat_interval) >= 0 else 1
    server = Server(
        settings,
        backend,
        settings.heartbeat_interval,
        args.max_concurrent,
        args.wait,
        args.stop_timeout,
        args.metrics_port,
    )
    install_signal_handlers(server)
    return server.serve()


def print_status(state_dir: Path, as_json: bool) -> int:
    """What this host holds: each run's backend, job, last state sent, and whether a live
    bridge process works it (if not, the next bridge start resumes it)."""
    rows = []
    for record in RunRecord.all(state_dir):
        document = record.load()
        final = document.get("final") or {}
        state = (
            f"final state spooled ({final.get('outcome')})"
            if final
            else document.get("last_state", "accepted")
        )
        rows.append(
            {
                "run": record.run_id,
                "backend": document.get("backend", ""),
                "job": document.get("handle"),
                "state": state,
                "worked": record.holder_alive(),
            }
        )
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        print(f"no runs held (state_dir {state_dir})")
        return 0
    for row in rows:
        who = (
            "worked by a live bridge process"
            if row["worked"]
            else "orphaned: the next bridge start resumes it"
        )
        print(f"{row['run']}  {row['backend']:<12}  {row['state']:<28}  {who}")
    return 0


def main_exit() -> None:
    sys.exit(main())
