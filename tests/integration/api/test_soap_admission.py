"""The SOAP ingress admits through the JSON API's own admission (`openhub.api.ingress`, issue 38): a route's
`sources=` and `validate=`, throttling, the size limit and drain refuse a SOAP request as they refuse a JSON
one, each as a SOAP fault, with nothing stored."""

from __future__ import annotations

import uuid

from lxml import etree

from openhub.api.app import with_settings
from openhub.core.soapxml import HUB, SOAP11
from openhub.service import actions as operator
from tests.integration.api.conftest import ADMIN, CRM, SHOP, make_client
from tests.integration.api.test_throttle_api import _throttle

NS = "urn:example:customers"


def envelope(cid: str = "1", pad: str = "") -> tuple[bytes, str]:
    message_id = f"urn:uuid:{uuid.uuid4()}"
    body = (
        f'<soap:Envelope xmlns:soap="{SOAP11}" xmlns:c="{NS}"><soap:Header><wsa:MessageID '
        f'xmlns:wsa="http://www.w3.org/2005/08/addressing">{message_id}</wsa:MessageID></soap:Header><soap:Body>'
        f"<c:customer><c:id>{cid}</c:id><c:name>Ada{pad}</c:name></c:customer></soap:Body></soap:Envelope>"
    )
    return body.encode(), message_id


def post(client, data: bytes, headers=SHOP, service: str = "soapsrc"):
    return client.post(f"/soap/{service}", content=data, headers={**headers, "Content-Type": "text/xml"})


def code(response) -> str | None:
    return etree.fromstring(response.content).findtext(f".//{{{HUB}}}code")


def stored(client, correlation_id: str) -> int:
    counted = client.get("/api/v1/messages:count", params={"correlation_id": correlation_id}, headers=ADMIN)
    return counted.json()["total"]


def test_the_json_apis_rules_refuse_soap_requests_as_faults(api_env):
    with make_client() as client:
        data, mid = envelope()
        ok = post(client, data)
        assert ok.status_code == 200 and b"AcceptResponse" in ok.content and stored(client, mid) == 1
        data, mid = envelope()
        refused = post(client, data, CRM)  # sources=["SHOP"]
        assert refused.status_code == 403 and code(refused) == "FORBIDDEN" and b"SHOP" in refused.content
        data, mid = envelope("0")  # validate= refuses it
        invalid = post(client, data)
        assert invalid.status_code == 500 and code(invalid) == "INVALID" and stored(client, mid) == 0
        wrong = client.post("/soap/soapsrc", content=data, headers={**SHOP, "Content-Type": "application/json"})
        assert wrong.status_code == 415 and code(wrong) == "UNSUPPORTED_MEDIA_TYPE"
        operator.drain("soap test")
        try:
            data, mid = envelope()
            drained = post(client, data)
            assert drained.status_code == 503 and code(drained) == "DRAINING" and stored(client, mid) == 0
            assert b"soap test" in drained.content and drained.headers["Retry-After"] == "60"
        finally:
            operator.undrain()
    with make_client(settings=with_settings(max_payload_bytes=1000)) as small:
        data, mid = envelope(pad="x" * 2000)
        big = post(small, data)
        assert big.status_code == 413 and code(big) == "TOO_LARGE" and stored(small, mid) == 0
    with make_client(throttle=_throttle("SHOP.setCustomer=1/86400", f"t-{uuid.uuid4().hex}:")) as throttled:
        assert post(throttled, envelope()[0]).status_code == 200
        data, mid = envelope()
        over = post(throttled, data)
        assert over.status_code == 429 and code(over) == "THROTTLED" and int(over.headers["Retry-After"]) >= 1
        assert stored(throttled, mid) == 0
