"""Every bad request of the table (`serve_bad_requests.ROWS`) gets its status and an
OpenAI-shaped error, never a traceback; the README shows exactly what the server answers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from serve_bad_requests import ROWS, Servers, markdown

from core import Ensemble

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = re.compile(r"<!-- serve-errors:start -->\n(.*?)\n<!-- serve-errors:end -->", re.S)


@pytest.fixture(scope="module")
def servers(shipped_members):
    ensemble = Ensemble(list(shipped_members), "safe", max_concurrency=1, max_queue=0)
    servers = Servers(ensemble)
    yield servers
    servers.close()


def test_the_table_is_large_and_its_cases_distinct():
    assert len(ROWS) >= 40
    assert len({row.case for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[row.case for row in ROWS])
def test_each_bad_request_gets_its_status_and_error(servers, row):
    status, body, headers = servers.answer(row)
    assert status == row.status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert error["code"] == row.code and error["param"] == row.param
    assert error["message"] and "Traceback" not in error["message"]
    assert error["type"] == {401: "authentication_error", 429: "rate_limit_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    assert headers["x-request-id"]
    if status == 429:
        assert int(headers["retry-after"]) >= 1
    if status == 401:
        assert "sk-" not in error["message"]  # no key is ever repeated back


def test_the_readme_shows_what_the_server_answers(servers):
    answers = [servers.answer(row)[:2] for row in ROWS]
    found = SECTION.search(README.read_text(encoding="utf-8"))
    assert found, (
        "README.md has no serve-errors section; run python -m lab.scripts.serve_error_table"
    )
    assert found.group(1) == markdown(ROWS, answers), "run python -m lab.scripts.serve_error_table"
