import hvac
import pytest
from rest_framework.test import APIClient

from puppet_connection.models import PuppetConnection
from tests.conftest import bridge, client_for

URL = "/api/connections/puppet/"


def assert_problem(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert body["type"].startswith("urn:relay:problem:")
    assert body["title"] and body["detail"]
    return body


def test_create_answers_the_token_once_and_not_cacheable(alice_api, bao):
    response = alice_api.post(URL, {"name": "prod", "description": "the fleet"}, format="json")
    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    body = response.json()
    token = body["token"]
    assert token.startswith("rlyp_") and body["token_prefix"] == token[:17]
    assert body["name"] == "prod" and body["owner"] == "alice" and body["description"] == "the fleet"
    # The token works, and it is what Vault holds for the connection.
    assert bridge(token).get("/_puppet/runs").json() == {"runs": []}
    assert bao.read(f"relay/connections/puppet/{body['id']}") == {"token": token}
    # It never appears again.
    again = alice_api.get(f"{URL}{body['id']}/")
    assert again.status_code == 200 and token not in again.content.decode()
    assert "token" not in again.json()
    assert token not in alice_api.get(URL).content.decode()


def test_users_see_only_their_own_connections_and_staff_see_all(alice, bob, staff):
    alice_conn, _ = PuppetConnection.create_with_token(owner=alice, name="a")
    PuppetConnection.create_with_token(owner=bob, name="b")
    alice_api = client_for(alice)
    assert [c["name"] for c in alice_api.get(URL).json()["results"]] == ["a"]
    assert sorted(c["name"] for c in client_for(staff).get(URL).json()["results"]) == ["a", "b"]
    bob_api = client_for(bob)
    assert_problem(bob_api.get(f"{URL}{alice_conn.id}/"), 404)
    assert_problem(bob_api.delete(f"{URL}{alice_conn.id}/"), 404)
    assert_problem(bob_api.post(f"{URL}{alice_conn.id}/regenerate/"), 404)
    assert client_for(staff).get(f"{URL}{alice_conn.id}/").status_code == 200


def test_two_users_may_use_the_same_name(alice, bob):
    assert client_for(alice).post(URL, {"name": "prod"}, format="json").status_code == 201
    assert client_for(bob).post(URL, {"name": "prod"}, format="json").status_code == 201


@pytest.mark.parametrize(
    ("body", "pointer", "code"),
    [
        ({"name": ""}, "#/name", "blank"),
        ({}, "#/name", "required"),
        ({"name": "x" * 65}, "#/name", "max_length"),
        ({"name": "has space"}, "#/name", "invalid"),
        ({"name": "-leading-dash"}, "#/name", "invalid"),
        ({"name": 12}, "#/name", "invalid"),
        ({"name": "ok", "description": "d" * 2001}, "#/description", "max_length"),
    ],
)
def test_bad_names_are_400_with_field_errors(alice_api, body, pointer, code):
    problem = assert_problem(alice_api.post(URL, body, format="json"), 400)
    assert problem["type"] == "urn:relay:problem:validation_error"
    assert {"pointer": pointer, "code": code} == {k: problem["errors"][0][k] for k in ("pointer", "code")}
    assert PuppetConnection.objects.count() == 0


def vault_keys(bao) -> set[str]:
    listing = bao.root().secrets.kv.v2.list_secrets("relay/connections/puppet/", mount_point="secret")
    return set(listing["data"]["keys"])


def test_a_duplicate_name_is_400_and_stores_nothing(alice_api, bao):
    alice_api.post(URL, {"name": "prod"}, format="json")
    keys_before = vault_keys(bao)
    problem = assert_problem(alice_api.post(URL, {"name": "prod"}, format="json"), 400)
    assert problem["errors"] == [
        {
            "pointer": "#/name",
            "detail": "You already have a puppet connection with this name.",
            "code": "unique",
        }
    ]
    assert PuppetConnection.objects.count() == 1
    assert vault_keys(bao) == keys_before


def test_malformed_json_and_wrong_content_type_are_problems(alice_api):
    assert_problem(alice_api.post(URL, "{not json", content_type="application/json"), 400)
    assert_problem(alice_api.post(URL, "name=x", content_type="application/x-www-form-urlencoded"), 415)
    assert_problem(alice_api.post(URL, "[1, 2]", content_type="application/json"), 400)


def test_unauthenticated_calls_are_401_problems():
    response = APIClient().get(URL)
    assert_problem(response, 401)
    assert response["WWW-Authenticate"] == "Token"


def test_a_connection_token_is_not_a_user_credential(connection):
    _, token = connection
    assert_problem(bridge(token).get(URL), 401)


def test_unknown_and_non_uuid_ids_are_404_problems(alice_api):
    assert_problem(alice_api.get(f"{URL}not-a-uuid/"), 404)
    assert_problem(alice_api.get(f"{URL}8e659097-254a-4b27-bb93-88efea9a9f0e/"), 404)
    assert_problem(alice_api.get("/api/no-such-thing/"), 404)
    assert_problem(alice_api.put(URL, {}, format="json"), 405)


def test_regenerate_answers_a_new_token_and_the_old_stops_at_once(alice_api, connection, bao):
    conn, old = connection
    response = alice_api.post(f"{URL}{conn.id}/regenerate/")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    new = response.json()["token"]
    assert new != old and response.json()["token_regenerated_at"]
    assert bridge(old).get("/_puppet/runs").status_code == 401
    assert bridge(new).get("/_puppet/runs").status_code == 200
    assert bao.read(conn.vault_path) == {"token": new}


def test_delete_removes_the_connection_its_token_and_its_vault_secret(
    alice_api, connection, bao, django_capture_on_commit_callbacks
):
    conn, token = connection
    with django_capture_on_commit_callbacks(execute=True):
        assert alice_api.delete(f"{URL}{conn.id}/").status_code == 204
    assert not PuppetConnection.objects.filter(pk=conn.pk).exists()
    assert bridge(token).get("/_puppet/runs").status_code == 401
    assert bao.read(conn.vault_path) is None
    with pytest.raises(hvac.exceptions.InvalidPath):  # every version and the metadata
        bao.root().secrets.kv.v2.read_secret_metadata(conn.vault_path, mount_point="secret")


def test_name_and_description_can_be_changed(alice_api, connection):
    conn, _ = connection
    response = alice_api.patch(f"{URL}{conn.id}/", {"description": "new words"}, format="json")
    assert response.status_code == 200 and response.json()["description"] == "new words"


def test_the_openapi_schema_and_docs_are_served(alice_api):
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/connections/puppet/{id}/regenerate/" in schema.json()["paths"]
    docs = APIClient().get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
