"""Operators' job queries (flexiqd.daemon.job_queries): checked, paged, and the documents answered."""

from __future__ import annotations

import pytest

from flexiqd.daemon.job_queries import MAX_LIMIT, JobQuery, job_document, page_document, parse_query
from flexiqd.errors import ControlError
from flexiqd.queue import NewJob
from flexiqd.queue.sqlite.database import SQLiteBackend
from flexiqd.queue.types import JobState


def test_a_query_reads_its_filters_and_an_empty_one_asks_for_the_newest():
    assert parse_query("") == JobQuery()
    query = parse_query('{"queue": "mail", "task": "send", "state": "dead", "tenant": "", "before": 90, "limit": 10}')
    assert query == JobQuery(queue="mail", task="send", state=JobState.DEAD, tenant="", before=90, limit=10)


@pytest.mark.parametrize("text, says", [
    ("[1]", "must be a JSON object"),
    ("{", "not JSON"),
    ('{"colour": "red"}', "no field 'colour'"),
    ('{"state": "lost"}', "state must be one of"),
    ('{"queue": ""}', "queue must be a non-empty string"),
    ('{"before": -3}', "before must be a job id"),
    (f'{{"limit": {MAX_LIMIT + 1}}}', f"limit must be a whole number from 1 to {MAX_LIMIT}"),
    ('{"limit": true}', "limit must be a whole number"),
])
def test_a_bad_query_is_refused_naming_the_field(text, says):
    with pytest.raises(ControlError, match=says):
        parse_query(text)


def test_pages_end_when_a_page_is_not_full_and_a_job_document_has_its_data(tmp_path):
    store = SQLiteBackend(str(tmp_path / "q.db"))
    ids = store.enqueue([NewJob(task="t", payload={"to": "a@b"}) for _ in range(3)], now=1.0)
    query = JobQuery(limit=2)
    first = page_document(store.list_jobs(limit=2), query)
    assert [j["id"] for j in first["jobs"]] == [ids[2], ids[1]] and first["next"] == ids[1]
    assert "payload" not in first["jobs"][0]
    last = page_document(store.list_jobs(limit=2, before=ids[1]), query)
    assert [j["id"] for j in last["jobs"]] == [ids[0]] and last["next"] is None
    whole = job_document(store.get(ids[0]), store.executions(job_id=ids[0]))
    assert whole["job"]["payload"] == {"to": "a@b"} and whole["job"]["state"] == "queued"
    assert whole["attempts"] == []
    store.close()
