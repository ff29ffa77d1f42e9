import json
import sys

from django.views.debug import ExceptionReporter

from relay.api import problems
from relay.api.authentication import token_from_header


def crash_while_holding(header: str) -> None:
    token = token_from_header(header)  # a local holding the plain token
    raise RuntimeError(f"crashed after reading a token of length {len(token)}")


def test_a_debug_error_page_never_shows_the_token(connection, rf, settings):
    settings.DEBUG = True
    _, token = connection
    request = rf.post("/_puppet/runs", {"x": token}, HTTP_AUTHORIZATION=f"Bearer {token}")
    try:
        crash_while_holding(f"Bearer {token}")
    except RuntimeError:
        reporter = ExceptionReporter(request, *sys.exc_info())
    html, text = reporter.get_traceback_html(), reporter.get_traceback_text()
    assert "crashed after reading a token" in html  # the page was really rendered
    assert "HTTP_AUTHORIZATION" in html
    for page in (html, text):
        assert token not in page
        assert token[17:-6] not in page


def test_a_crash_on_an_api_path_is_a_problem_document(rf):
    response = problems.handler500(rf.get("/_puppet/runs"))
    assert response.status_code == 500
    assert response["Content-Type"] == "application/problem+json"
    assert json.loads(response.content)["type"] == "urn:relay:problem:server_error"


def test_a_crash_elsewhere_is_django_s_page(rf):
    response = problems.handler500(rf.get("/admin/"))
    assert response.status_code == 500 and response["Content-Type"].startswith("text/html")


def test_a_lost_database_connection_is_a_503_problem(rf):
    from django.db import OperationalError
    from rest_framework.request import Request

    request = Request(rf.get("/_puppet/runs"))
    response = problems.exception_handler(
        OperationalError("server closed the connection"), {"request": request}
    )
    assert response.status_code == 503
    assert response.data["type"] == "urn:relay:problem:service_unavailable"
    assert "closed" not in response.data["detail"]  # no internals in the answer
