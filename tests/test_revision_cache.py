"""The engine's parsed-revision cache (workflows.engine.parsed) is bounded by bytes
(PARSED_CACHE_MAX_BYTES), weighed by what each parsed document holds, not by a count."""

import gc
import tracemalloc

import pytest

from tests.workflow_helpers import NOOP
from workflows import engine
from workflows.dialect import validate
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def document(steps: int, width: int) -> str:
    spec = f"    text: '{'x' * width}'\n    list: [1, 'two', {{a: b}}]\n"
    body = "".join(f"- name: s{index}\n  image: {NOOP}\n  spec:\n{spec}" for index in range(steps))
    return f"apiVersion: v1\nsteps:\n{body}"


@pytest.fixture(autouse=True)
def empty_cache():
    engine.parsed.clear()
    yield
    engine.parsed.clear()


def revisions(owner, count: int, source: str) -> list[int]:
    workflow = Workflow.objects.create(owner=owner, name="big")
    return [workflow.add_revision(source + f"# {index}\n", owner).pk for index in range(count)]


def test_the_weight_of_a_parsed_document_is_what_it_holds():
    source = document(300, 500)  # about 190 KB
    gc.collect()
    tracemalloc.start()
    parsed = validate.parse(source, stored=True)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert 0.7 * held <= engine.footprint(parsed) <= 1.1 * held
    assert engine.footprint(parsed) > len(source)


def test_the_cache_evicts_by_bytes_the_least_recently_used_first(alice, settings):
    ids = revisions(alice, 6, document(100, 400))
    weight = engine.footprint(engine.parsed(ids[0]))
    engine.parsed.clear()
    settings.PARSED_CACHE_MAX_BYTES = int(weight * 3.5)
    for revision_id in ids[:3]:
        engine.parsed(revision_id)
    assert list(engine.parsed.entries) == ids[:3]
    engine.parsed(ids[0])  # used again: the newest now
    engine.parsed(ids[3])
    assert list(engine.parsed.entries) == [ids[2], ids[0], ids[3]]
    for revision_id in ids[4:]:
        engine.parsed(revision_id)
    assert list(engine.parsed.entries) == [ids[3], ids[4], ids[5]]
    assert engine.parsed.bytes <= settings.PARSED_CACHE_MAX_BYTES
    assert engine.parsed.bytes == sum(size for _, size in engine.parsed.entries.values())
    # A kept entry is the same object each time: parsed once.
    assert engine.parsed(ids[5]) is engine.parsed(ids[5])


def test_many_large_revisions_stay_within_the_budget(alice, settings):
    settings.PARSED_CACHE_MAX_BYTES = 2 * 1024 * 1024
    ids = revisions(alice, 8, document(400, 1500))  # about 640 KB of text each
    for revision_id in ids:
        assert engine.parsed(revision_id).steps[0].name == "s0"
    weight = engine.parsed.entries[ids[-1]][1]
    assert weight > 640_000
    assert list(engine.parsed.entries) == ids[-(2 * 1024 * 1024 // weight) :]
    assert engine.parsed.bytes <= 2 * 1024 * 1024


def test_a_document_heavier_than_the_budget_is_parsed_but_not_kept(alice, settings):
    (revision_id,) = revisions(alice, 1, document(50, 100))
    settings.PARSED_CACHE_MAX_BYTES = 1000
    first, second = engine.parsed(revision_id), engine.parsed(revision_id)
    assert first.steps == second.steps and first is not second
    assert not engine.parsed.entries and engine.parsed.bytes == 0
