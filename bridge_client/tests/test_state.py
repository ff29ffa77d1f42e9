"""What the bridge keeps on disk: only run ids that are UUIDs become paths, and everything
under state_dir is the bridge's alone (0700/0600) whatever the umask it was started with."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from relay_bridge.state import RunRecord, StateDirError, prepare

RUN = "6f9619ff-8b86-4011-b42d-00c04fc964ff"


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("run_id", ["/etc", "../../x", f"{RUN}/../../x", RUN.upper(), "", "."])
def test_a_run_record_is_only_ever_a_uuid_under_runs(tmp_path, run_id):
    with pytest.raises(ValueError, match="not a run id"):
        RunRecord(tmp_path, run_id)


def test_state_files_are_0600_in_0700_directories_whatever_the_umask(tmp_path, umask_000):
    state_dir = tmp_path / "state"
    prepare(state_dir)
    record = RunRecord(state_dir, RUN)
    assert record.lock()
    record.save(run={"id": RUN})
    record.save(last_state="in-progress")  # written aside and renamed over: still 0600
    record.unlock()
    assert {mode(p) for p in (state_dir, state_dir / "runs", record.dir)} == {0o700}
    assert {mode(p) for p in record.dir.iterdir()} == {0o600}


def test_an_existing_state_dir_others_can_read_is_tightened_when_it_is_the_bridge_s(tmp_path, umask_000):
    state_dir = tmp_path / "state"
    (state_dir / "runs").mkdir(parents=True, mode=0o755)
    state_dir.chmod(0o755)
    prepare(state_dir)
    assert mode(state_dir) == mode(state_dir / "runs") == 0o700


def test_a_state_dir_others_can_read_that_holds_other_files_is_refused_not_chmodded(tmp_path):
    shared = tmp_path / "var"  # `state_dir: /var`, say
    (shared / "lib").mkdir(parents=True)
    shared.chmod(0o755)
    with pytest.raises(StateDirError, match="open to other users"):
        prepare(shared)
    assert mode(shared) == 0o755 and not (shared / "runs").exists()


def test_directories_not_named_as_runs_are_not_taken_for_runs(tmp_path):
    (tmp_path / "runs" / "not-a-run").mkdir(parents=True)
    (tmp_path / "runs" / "not-a-run" / "run.json").write_text('{"run": {"id": "not-a-run"}}')
    mismatched = tmp_path / "runs" / RUN
    mismatched.mkdir()
    (mismatched / "run.json").write_text('{"run": {"id": "/etc"}}')  # a record must name its own run
    assert [r.run_id for r in RunRecord.all(tmp_path)] == [RUN]
    assert list(RunRecord.orphans(tmp_path)) == []
    assert not mismatched.exists()  # unusable: removed
