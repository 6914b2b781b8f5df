"""Requests the server does not serve get a clean answer, never a traceback or a dropped
connection; and every admin action checks its permission, role by role."""

import json
import urllib.error
import urllib.request

import pytest
import websockets
from django.contrib.auth.models import Permission, User
from django.test import Client as HttpClient
from django.utils import timezone

from pool import control
from pool.models import APIKey, ServerProcess, Session, Unit
from pool.states import ProcessState, UnitState


def _post(url, token):
    request = urllib.request.Request(url, data=b"{}", method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer ek_" + "x" * 43}])
async def test_a_websocket_to_a_path_nobody_serves_is_refused_at_the_handshake(scripted_server, headers):
    """Daphne's one refusal before accept is HTTP 403 (it has no other status for a WebSocket)."""
    for path in ("/v2/realtime", "/v1/realtime/more", "/"):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(f"ws://127.0.0.1:{scripted_server.port}{path}", additional_headers=headers)
        assert refused.value.response.status_code == 403
    assert "Traceback" not in scripted_server.log.read_text()


def test_a_long_bearer_token_gets_401_with_an_openai_error(scripted_server):
    url = f"{scripted_server.http_url}/v1/realtime/client_secrets"
    for token in ("s2s_" + "x" * 20_000, "s2s_" + "x" * 60_000):
        status, body = _post(url, token)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", (len(token), body)


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["abc/export/", "..%2F..%2Fetc%2Fpasswd/recording/user/", "99999/export/",
                                  "1%2F2/recording/assistant/"])
def test_the_export_or_recording_of_a_session_that_does_not_exist_is_404(admin_client, path):
    assert admin_client.get(f"/admin/pool/session/{path}").status_code == 404


@pytest.mark.django_db
def test_the_overview_release_of_a_unit_that_is_not_a_number_is_404(admin_client):
    reply = admin_client.post("/admin/pool/serverprocess/overview/", {"unit": "abc"})
    assert reply.status_code == 404


# --- every admin action, role by role -------------------------------------------------------

def _staff(name, *codenames):
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    browser = HttpClient()
    assert browser.login(username=name, password="pw")
    return browser


def _run_action(browser, changelist, action, pk):
    return browser.post(changelist, {"action": action, "_selected_action": [str(pk)]}, follow=True)


def _revocable():
    return APIKey.issue("k")[0]


def _quarantined():
    process = ServerProcess.objects.create(host="elsewhere", pid=1, pool_size=1, heartbeat_at=timezone.now(),
                                           control_channel="pool-control.elsewhere")
    session = Session.objects.create(session_id="sess_q", process=process, unit_index=0, created_at=timezone.now())
    return Unit.objects.create(process=process, index=0, state=UnitState.QUARANTINED, session_id=session.session_id,
                               state_since=timezone.now())


def _running():
    return ServerProcess.objects.create(host="elsewhere", pid=2, pool_size=1, heartbeat_at=timezone.now())


ACTIONS = [
    # (changelist, action, the row it acts on, who may only look, who may act, whether it was done)
    ("/admin/pool/apikey/", "revoke_keys", _revocable, ["view_apikey"], ["view_apikey", "change_apikey"],
     lambda key: APIKey.objects.get(pk=key.pk).revoked_at is not None),
    ("/admin/pool/quarantinedunit/", "release_units", _quarantined, ["view_quarantinedunit"],
     ["view_quarantinedunit", "release_unit"], lambda unit: Session.objects.get(session_id="sess_q").released_at),
    ("/admin/pool/serverprocess/", "drain_processes", _running, ["view_serverprocess"],
     ["view_serverprocess", "drain_process"],
     lambda process: ServerProcess.objects.get(pk=process.pk).state == ProcessState.DRAINING),
]


@pytest.mark.django_db
@pytest.mark.parametrize("changelist, action, make, viewer, actor, done", ACTIONS, ids=[a[1] for a in ACTIONS])
def test_an_admin_action_is_carried_out_only_with_its_permission(monkeypatch, changelist, action, make, viewer,
                                                                  actor, done):
    monkeypatch.setattr(control, "CONFIRM_SECONDS", 0.1)  # a remote release is not confirmed here
    row = make()
    looker = _staff("looker", *viewer)
    assert looker.get(changelist).status_code == 200
    assert action.encode() not in looker.get(changelist).content  # not offered
    _run_action(looker, changelist, action, row.pk)  # and not carried out when posted anyway
    assert not done(row)
    _run_action(_staff("operator", *actor), changelist, action, row.pk)
    assert done(row)
