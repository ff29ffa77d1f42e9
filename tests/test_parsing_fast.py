"""The differential test: the rapidyaml fast path reads every document it takes exactly as
the reference reader (PyYAML's CSafeLoader with tags stripped, then plain()) does, and it
does take Puppet's own reports."""

import shutil
import time

import pytest

from tests.events_helpers import FIXTURES, big_report, puppet_apply, stored_report
from triggers.parsing import PSYCH_REPORT, load_yaml, load_yaml_fast, plain, read_yaml

BUDGET = 10**8


def reference(data: bytes):
    return plain(load_yaml(data), BUDGET)


def assert_same_or_declined(data: bytes) -> bool:
    """True when the fast path took the document (and read it the same)."""
    fast = load_yaml_fast(data)
    if fast is not None:
        assert fast == reference(data)
    return fast is not None


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_every_fixture_reads_the_same(name):
    data = (FIXTURES / name).read_bytes()
    taken = assert_same_or_declined(data)
    # Modern Puppet's reports are the fast path's; 2.6 (aliases, Time objects) and the 4.8
    # one (unquoted times) are the reference reader's.
    assert taken == (name.startswith(("puppet-7", "puppet-8")))
    assert read_yaml(data, BUDGET) == reference(data)


def test_a_large_report_reads_the_same():
    assert assert_same_or_declined(big_report(2000))


NEEDS_PUPPET = pytest.mark.skipif(
    shutil.which("puppet") is None, reason="needs puppet-agent (.ci/run installs it)"
)


@NEEDS_PUPPET
@pytest.mark.parametrize(
    ("manifest", "flags", "fast"),
    [
        # Psych quotes what it would read as non-strings (`yes`, `~`, `017`, `12:30`, dates):
        # the fast path reads this the same.
        (
            "class profile::web {{ file {{ '{dir}/a': content => \"yes\\n~\\n017\\n\" }} }}\n"
            "include profile::web\n"
            "notify {{ 'a': message => 'yes' }} notify {{ 'b': message => '~' }}\n"
            "notify {{ 'c': message => '017' }}\n"
            "notify {{ 'd': message => '12:30' }} notify {{ 'e': message => '2024-01-01' }}\n"
            "notify {{ 'f': message => 'on' }} notify {{ 'g': message => '1.0' }}\n",
            [],
            True,
        ),
        # ...but writes `1e3` bare, a string to PyYAML and a number to rapidyaml: declined.
        ("notify {{ '1e3': }}\n", [], False),
        ("exec {{ 'fails': command => '/bin/false' }}\nfile {{ '{dir}/b': content => 'b' }}\n", [], True),
        ("file {{ '{dir}/c': content => 'c' }}\n", ["--noop"], True),
    ],
)
def test_reports_a_real_puppet_makes_read_the_same(tmp_path, manifest, flags, fast):
    puppet_apply(
        tmp_path, manifest.format(dir=tmp_path), "--reports=store", f"--reportdir={tmp_path}/reports", *flags
    )
    data = stored_report(tmp_path)
    assert assert_same_or_declined(data) == fast
    assert read_yaml(data, BUDGET) == reference(data)


TRICKY = [
    "a: yes\nb: No\nc: ON\nd: off\n",
    "a: ~\nb: Null\nc: NULL\nd: null\ne:\n",
    "a: 017\nb: 0x1F\nc: 0o17\nd: 0b101\ne: 1_000\nf: +12\ng: -0\n",
    "a: 017\n",
    "a: 0x1F\n",
    "a: 0b101\n",
    "a: 1_000\n",
    "a: +12\n",
    "a: 12:30\n",
    "a: .5\n",
    "a: 1.\n",
    "a: 1_0.5\n",
    "a: +1.5\n",
    "a: .inf\n",
    "a: .NaN\n",
    "a: 2024-1-1\n",
    "a: 2024-01-01 10:00:00\n",
    "a: [yes]\n",
    "a: {b: ~}\n",
    "- Off\n",
    "017: a\n",
    "true: a\n",
    "null: a\n",
    "2024-01-01: a\n",
    "a: 1e3\nb: 1.0e3\nc: 1.0e+3\nd: 1.5E-2\ne: .5\nf: 1.\ng: -.inf\nh: .nan\ni: .Inf\n",
    "a: 12:30\nb: 1:20:30\nc: 190:20:30\n",
    "time: 2010-09-23 15:44:06.244173 -07:00\nb: 2024-01-01\nc: 2024-01-01T10:00:00Z\n",
    "a: &id001 [1, 2]\nb: *id001\n",
    "a: &x [1, 2]\nb: *x\nc: [*x, *x]\n",
    "base: &b {x: 1}\nm:\n  <<: *b\n  y: 2\n",
    "a: !!str 12\nb: !!int '12'\nc: !!binary aGVsbG8=\nd: !!set {x, y}\n",
    "a: 1\n---\nb: 2\n",
    "a: " + "[" * 70 + "]" * 70 + "\n",
    "a: " + "[" * 60 + "]" * 60 + "\n",
    "1: int key\ntrue: bool key\n~: null key\n",
    "a: \"tab\\there\\u0001\\\\ quote\\\" é 😀\"\nb: 'single ''quoted'''\nc: plain é\n",
    "a: |\n  literal\n   block\nb: >\n  folded\n  block\n",
    "a: {x: 1, y: [2, 3], z: {w: ~}}\nb: [yes, no, '017', 017]\n",
    "a: !ruby/sym status\n!ruby/sym key: 1\nc: !ruby/object:Puppet::Util::Log {level: !ruby/sym info}\n",
    "a: =\nb: '='\nc: :symbol\nd: -\ne: '-'\n",
    "a: 9223372036854775808\nb: -9223372036854775809\nc: 3.14159265358979323846\n",
    "a: \"\"\nb: ''\nc: ' '\n",
]


@pytest.mark.parametrize("body", TRICKY)
def test_tricky_documents_are_read_the_same_or_left_to_the_reference(body):
    data = PSYCH_REPORT + body.encode()
    assert_same_or_declined(data)
    assert read_yaml(data, BUDGET) == reference(data) if _readable(data) else True


def _readable(data: bytes) -> bool:
    try:
        reference(data)
    except Exception:
        return False
    return True


def test_values_that_only_begin_like_numbers_or_dates_do_not_decline():
    body = (
        "transaction_uuid: 0b5f0c2a-1111-4222-8333-444455556666\n"
        "catalog_uuid: 07c3a1e0-aaaa-4bbb-8ccc-dddd00001111\n"
        "code_id: 0x-not-hex\nmessage: 2024-01-01 was a Monday\nversion: 1.2.3\nline: 12\nratio: 0.5\n"
        "a: 1.0e-05\nport: :8140\nevaluation_time: 2.9775e-05\n"
    )
    assert assert_same_or_declined(PSYCH_REPORT + body.encode())


def test_a_document_without_puppet_s_header_is_the_reference_s():
    assert load_yaml_fast(b"host: a\nstatus: changed\n") is None


@pytest.mark.parametrize("value", [b"1" + b"_1" * 16000 + b"x", b"1." + b"1_" * 16000 + b"x"])
def test_the_fast_path_s_scans_take_linear_time(value):
    # Both once backtracked quadratically: 22 s for the first, 32 KB; a hang at 200 KB.
    data = PSYCH_REPORT + b"host: x\nv: " + value + b"\n"
    started = time.monotonic()
    assert read_yaml(data, BUDGET) == reference(data)
    assert time.monotonic() - started < 1
