"""`relay-bridge`'s command line: the options go before or after the command, and the
systemd units keep the state directory to root."""

import os
import stat
from pathlib import Path

import pytest
from relay_bridge.cli import parser, write_units


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "/etc/x.yaml", "--state-dir", "/s", "--log-level", "debug", "poll", "--once"],
        ["poll", "--once", "--config", "/etc/x.yaml", "--state-dir", "/s", "--log-level", "debug"],
        ["--config", "/etc/x.yaml", "poll", "--state-dir", "/s", "--once", "--log-level", "debug"],
    ],
)
def test_the_options_are_taken_before_or_after_the_command(argv):
    args = parser().parse_args(argv)
    assert (args.command, args.once, args.config, args.state_dir, args.log_level) == (
        "poll",
        True,
        Path("/etc/x.yaml"),
        "/s",
        "debug",
    )


def test_an_option_after_the_command_does_not_undo_one_before_it():
    args = parser().parse_args(["--backend", "bolt", "status", "--json"])
    assert (args.backend, args.json, args.config) == ("bolt", True, None)


def test_the_units_keep_state_dir_to_root_and_find_the_configuration(tmp_path):
    old = os.umask(0o077)
    try:
        written = write_units(tmp_path, "/usr/local/bin/relay-bridge", None)
    finally:
        os.umask(old)
    for unit in written:
        assert stat.S_IMODE(os.stat(unit).st_mode) == 0o644
    for name in ("relay-bridge.service", "relay-bridge-poll.service"):
        text = (tmp_path / name).read_text()
        assert "StateDirectoryMode=0700" in text and "UMask=0077" in text
        assert "ExecStart=/usr/local/bin/relay-bridge " in text and "--config" not in text
