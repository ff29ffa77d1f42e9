"""`POST /api/workflows/validate`, and the Workflow and WorkflowRevision models."""

import threading

import pytest
from django.db import IntegrityError, connection
from rest_framework.test import APIClient

from workflows.dialect.problems import DocumentError
from workflows.dialect.yamlload import MAX_BYTES
from workflows.models import Workflow

URL = "/api/workflows/validate"
VALID = "apiVersion: v1\nsteps:\n- name: hello\n  image: alpine\n  input: [echo hi]\n"
INVALID = (
    "apiVersion: v1\nsteps:\n- name: hello\n  image: alpine\n"
    "- name: bye\n  image: alpine\n  dependsOn: helo\n"
)


def post(client: APIClient, body: str | bytes, content_type: str = "application/yaml"):
    data = body.encode() if isinstance(body, str) else body
    return client.post(URL, data=data, content_type=content_type)


@pytest.mark.parametrize(
    "content_type", ["application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"]
)
def test_a_valid_document_is_valid(alice_api: APIClient, content_type: str) -> None:
    response = post(alice_api, VALID, content_type)
    assert response.status_code == 200, response.content
    assert response.json() == {"valid": True}


def test_an_invalid_document_is_a_problem_with_places(alice_api: APIClient) -> None:
    response = post(alice_api, INVALID)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "urn:relay:problem:invalid_workflow"
    assert body["status"] == 400 and body["instance"] == URL
    assert body["errors"] == [
        {
            "pointer": "#/steps/1/dependsOn",
            "line": 7,
            "column": 14,
            "detail": "dependsOn names 'helo', which is not a step of this workflow.",
        }
    ]
    assert body["detail"] == body["errors"][0]["detail"]


def test_several_errors_are_all_listed(alice_api: APIClient) -> None:
    response = post(alice_api, "apiVersion: v2\nsteps:\n- name: a\n- image: alpine\n")
    body = response.json()
    assert response.status_code == 400 and body["detail"] == "The workflow has 3 errors."
    assert [e["pointer"] for e in body["errors"]] == ["#/apiVersion", "#/steps/0", "#/steps/1"]


def test_warnings_come_with_a_valid_answer(alice_api: APIClient) -> None:
    response = post(alice_api, "steps:\n- name: a\n  image: alpine\n  spec: {x: !Fn.shout [hi]}\n")
    body = response.json()
    assert response.status_code == 200 and body["valid"] is True
    assert [w["pointer"] for w in body["warnings"]] == ["#/steps/0/spec/x"]


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ("", "#"),
        ("key: 'unterminated", "#"),
        ("a: &a [*a]", "#"),
        ("steps: !!python/name:os.system x", "#/steps"),
    ],
    ids=["empty", "bad YAML", "recursive alias", "python tag"],
)
def test_bad_yaml_is_a_400_never_a_500(alice_api: APIClient, body: str, pointer: str) -> None:
    response = post(alice_api, body)
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["pointer"] == pointer


def test_a_body_that_is_not_utf8_is_a_400(alice_api: APIClient) -> None:
    response = post(alice_api, b"steps: \xff\xfe")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert "UTF-8" in response.json()["detail"]


def test_an_oversized_body_is_a_413_before_it_is_parsed(alice_api: APIClient) -> None:
    response = post(alice_api, "a: '" + "x" * MAX_BYTES + "'\n")
    assert response.status_code == 413
    assert response.json()["type"] == "urn:relay:problem:payload_too_large"


def test_json_is_not_a_workflow_document(alice_api: APIClient) -> None:
    response = alice_api.post(URL, {"steps": []}, format="json")
    assert response.status_code == 415
    assert response["Content-Type"] == "application/problem+json"


def test_it_needs_a_user() -> None:
    response = post(APIClient(), VALID)
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"


def test_it_is_in_the_openapi_schema(alice_api: APIClient) -> None:
    from openapi_spec_validator import validate as validate_openapi

    schema = alice_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    validate_openapi(schema)
    operation = schema["paths"]["/api/workflows/validate"]["post"]
    assert "application/yaml" in operation["requestBody"]["content"]
    assert set(operation["responses"]) >= {"200", "400"}
    errors = schema["components"]["schemas"]["WorkflowInvalid"]["properties"]["errors"]
    assert errors["items"]["$ref"].endswith("/DocumentError")


# The models -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_revisions_keep_the_text_verbatim_and_number_up(alice) -> None:
    workflow = Workflow.objects.create(owner=alice, name="hello")
    source = "# my workflow\nsteps:   # spacing kept\n- {name: a, image: alpine}\n"
    first = workflow.add_revision(source, alice)
    second = workflow.add_revision(VALID, None)
    assert (first.number, second.number) == (1, 2)
    first.refresh_from_db()
    assert first.source == source and first.created_by == alice
    assert workflow.latest_revision() == second
    assert [s.name for s in second.parsed().steps] == ["hello"]


@pytest.mark.django_db
def test_an_invalid_document_is_not_saved(alice) -> None:
    workflow = Workflow.objects.create(owner=alice, name="hello")
    with pytest.raises(DocumentError) as raised:
        workflow.add_revision(INVALID, alice)
    assert raised.value.problems[0].pointer == "#/steps/1/dependsOn"
    assert workflow.revisions.count() == 0


@pytest.mark.django_db
def test_names_are_unique_per_owner(alice, bob) -> None:
    Workflow.objects.create(owner=alice, name="deploy")
    Workflow.objects.create(owner=bob, name="deploy")
    with pytest.raises(IntegrityError):
        Workflow.objects.create(owner=alice, name="deploy")


@pytest.mark.django_db(transaction=True)
def test_concurrent_saves_get_distinct_numbers(alice) -> None:
    workflow = Workflow.objects.create(owner=alice, name="race")
    numbers: list[int] = []
    barrier = threading.Barrier(4)

    def save() -> None:
        barrier.wait()
        try:
            numbers.append(Workflow.objects.get(pk=workflow.pk).add_revision(VALID, None).number)
        finally:
            connection.close()

    threads = [threading.Thread(target=save) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(numbers) == [1, 2, 3, 4]
