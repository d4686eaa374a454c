"""The SOAP ingress on a real `openhub serve` (issue 38): a real SOAP client (zeep) reads the served WSDL and
gets the typed accept response, and the message ends OK through a real worker with the decoded dict as its
payload; raw envelopes that are wrong or hostile are each a SOAP fault within a second, with nothing stored."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
import requests
import zeep
from lxml import etree
from zeep.transports import Transport
from zeep.wsa import WsAddressingPlugin

from openhub.core.soapxml import CONFIRMATION_XSD, HUB, SOAP11, SOAP12
from openhub.outbound import protocol
from tests.integration.api.test_serve_limits import ADMIN, KEY, served  # noqa: F401 - the real server fixture
from tests.support.waiting import wait_for

NS = "urn:example:customers"
BASIC = ("CRM", KEY)


def envelope(body: str, message_id: str | None = None, version: int = 11, doctype: str = "") -> bytes:
    ns = SOAP11 if version == 11 else SOAP12
    header = (
        (
            f'<soap:Header><wsa:MessageID xmlns:wsa="http://www.w3.org/2005/08/addressing">{message_id}'
            "</wsa:MessageID></soap:Header>"
        )
        if message_id
        else ""
    )
    return (
        f'<?xml version="1.0"?>{doctype}<soap:Envelope xmlns:soap="{ns}" xmlns:c="{NS}">{header}'
        f"<soap:Body>{body}</soap:Body></soap:Envelope>"
    ).encode()


def customer(cid: str = "42", extra: str = "", attrs: str = "") -> str:
    return f"<c:customer{attrs}><c:id>{cid}</c:id><c:name>Ada{extra}</c:name><c:credit>12.50</c:credit></c:customer>"


def post(served, data: bytes, service: str = "soaptest", version: int = 11, auth=BASIC) -> httpx.Response:  # noqa: F811
    media = "text/xml" if version == 11 else "application/soap+xml"
    return httpx.post(
        f"{served.base}/soap/{service}",
        content=data,
        auth=auth,
        timeout=30,
        headers={"Content-Type": f"{media}; charset=utf-8"},
    )


def fault_of(response: httpx.Response) -> dict[str, str | None]:
    root = etree.fromstring(response.content)
    return {
        "code": root.findtext(f".//{{{HUB}}}code"),
        "element": root.findtext(f".//{{{HUB}}}element"),
        "reason": (root.findtext(".//faultstring") or root.findtext(f".//{{{SOAP12}}}Text")),
        "soap12code": root.findtext(f".//{{{SOAP12}}}Value"),
        "first": root.findtext(f".//{{{HUB}}}messageId"),
    }


def stored(served, correlation_id: str) -> int:  # noqa: F811
    r = httpx.get(
        f"{served.base}/api/v1/messages:count",
        params={"correlation_id": correlation_id},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return r.json()["total"]


def test_zeep_gets_the_typed_accept_response_and_the_message_ends_ok(served, hub, external):  # noqa: F811
    session = requests.Session()
    session.auth = BASIC
    client = zeep.Client(
        f"{served.base}/soap/soaptest?wsdl", transport=Transport(session=session), plugins=[WsAddressingPlugin()]
    )
    ident = f"cust-{uuid.uuid4().hex[:8]}"
    answer = client.service.setCustomer(id=ident, name="Ada Lovelace", credit="12.50", kind="vip")
    assert answer.messageId > 0 and answer.state == "NEW" and answer.route == "soaptest.setCustomer"
    assert answer.correlationId.startswith("urn:uuid:")  # the WS-Addressing MessageID zeep sent
    admin = {"Authorization": f"Bearer {ADMIN}"}

    def detail() -> dict:
        return httpx.get(f"{served.base}/api/v1/messages/{answer.messageId}", headers=admin, timeout=10).json()

    done = wait_for(lambda: (d := detail())["state"] == "OK" and d, 60, "the SOAP message to end OK")
    assert done["payload"] == {"id": ident, "name": "Ada Lovelace", "credit": 12.5, "kind": "vip"}
    assert done["source_system"] == "CRM" and external.count(f"/soap/{ident}") == 1
    exchanges = done["http_exchanges"]
    soap = [x for x in exchanges if x["step"] == "soap"]
    assert soap and "Ada Lovelace" in soap[0]["request_body"] and "AcceptResponse" in soap[0]["response_body"]


@pytest.mark.serve_env(OPENHUB_MAX_PAYLOAD_BYTES=str(8 * 1024 * 1024))
def test_wrong_and_hostile_envelopes_are_faults_at_once_and_store_nothing(served):  # noqa: F811
    def mid() -> str:
        return f"urn:uuid:{uuid.uuid4()}"

    bomb = (
        '<!DOCTYPE lolz [<!ENTITY lol "lol">'
        + "".join(f'<!ENTITY lol{i} "{("&lol%s;" % (i - 1 if i > 1 else "")) * 10}">' for i in range(1, 10))
        + "]>"
    )
    deep = "".join("<c:x>" for _ in range(100)) + "".join("</c:x>" for _ in range(100))
    cases = {  # name: (service, body, doctype, expected code, element the fault names, reason holds)
        "wrong element": (
            "soaptest",
            "<c:supplier><c:id>1</c:id></c:supplier>",
            "",
            "UNKNOWN_ELEMENT",
            "supplier",
            "expected one of",
        ),
        "missing field": ("soaptest", "<c:customer><c:id>1</c:id></c:customer>", "", "VALIDATION", "customer", "name"),
        "unknown route": ("nosuch", customer(), "", "UNKNOWN_ROUTE", None, "nosuch"),
        "XXE": (
            "soaptest",
            customer(extra="&xxe;"),
            '<!DOCTYPE x [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>',
            "HOSTILE_XML",
            None,
            "DTD",
        ),
        "billion laughs": ("soaptest", customer(extra="&lol9;"), bomb, "HOSTILE_XML", None, "DTD"),
        "100-level nesting": (
            "soaptest",
            f"<c:customer><c:id>1</c:id>{deep}</c:customer>",
            "",
            "HOSTILE_XML",
            "x",
            "deeper than",
        ),
        "5 MB attribute": (
            "soaptest",
            customer(attrs=f' kind="{"A" * 5_000_000}"'),
            "",
            "HOSTILE_XML",
            "customer",
            "attribute kind",
        ),
    }
    for name, (service, body, doctype, code, element, reason) in cases.items():
        message_id = mid()
        started = time.monotonic()
        r = post(served, envelope(body, message_id, doctype=doctype), service)
        took = time.monotonic() - started
        assert r.status_code in (404, 500), (name, r.status_code, r.text[:500])
        assert r.headers["content-type"].startswith("text/xml"), name
        fault = fault_of(r)
        assert fault["code"] == code, (name, fault)
        assert element is None or fault["element"] == element, (name, fault)
        assert reason in (fault["reason"] or ""), (name, fault)
        # At once: a parser that expanded the entities or walked the 5 MB attribute would take minutes or
        # the memory; 10 s is a loaded box's room for the rest (1.27 s for a wrong element at load 20, stop 49).
        assert took < 10.0, f"{name}: answered in {took:.2f} s"
        assert stored(served, message_id) == 0, name

    message_id = mid()  # a duplicate correlation id: the first is stored, the second is a fault naming it
    first = post(served, envelope(customer("dup"), message_id))
    assert first.status_code == 200, first.text
    again = post(served, envelope(customer("dup"), message_id))
    fault = fault_of(again)
    assert again.status_code == 500 and fault["code"] == "DUPLICATE" and fault["element"] == "customer"
    assert fault["first"] == etree.fromstring(first.content).findtext(f".//{{{HUB}}}messageId")
    assert stored(served, message_id) == 1


def test_soap_12_faults_auth_and_correlation(served):  # noqa: F811
    r = post(served, envelope("<c:supplier/>", f"urn:uuid:{uuid.uuid4()}", version=12), version=12)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/soap+xml")
    assert fault_of(r)["soap12code"] == "soap:Sender" and fault_of(r)["element"] == "supplier"
    ok = post(served, envelope(customer(), f"urn:uuid:{uuid.uuid4()}", version=12), version=12)
    assert ok.status_code == 200 and b"AcceptResponse" in ok.content
    for auth in (None, ("SHOP", KEY), ("CRM", "wrong")):  # no key, the key under another name, a wrong key
        r = post(served, envelope(customer(), f"urn:uuid:{uuid.uuid4()}"), auth=auth)
        assert r.status_code == 401 and fault_of(r)["code"] == "UNAUTHORIZED", auth
    bearer = httpx.post(
        f"{served.base}/soap/soaptest",
        content=envelope(customer(), None),
        timeout=10,
        headers={
            "Content-Type": "text/xml",
            "Authorization": f"Bearer {KEY}",
            "X-Correlation-Id": f"h-{uuid.uuid4().hex}",
            "X-Process-Id": "p-1",
        },
    )
    assert bearer.status_code == 200, bearer.text
    none = post(served, envelope(customer(), None))
    assert none.status_code == 500 and fault_of(none)["code"] == "NO_CORRELATION_ID"
    wsdl = httpx.get(f"{served.base}/soap/soaptest?wsdl", auth=BASIC, timeout=10)
    assert wsdl.status_code == 200 and b'soapAction="urn:openhub:soaptest.setCustomer"' in wsdl.content
    assert httpx.get(f"{served.base}/soap/soaptest?wsdl", timeout=10).status_code == 401
    # the confirmation protocol's contract is published to anyone: what a source system implements
    published = httpx.get(f"{served.base}/api/v1/schemas/confirmation", timeout=10)
    assert published.status_code == 200 and published.json() == protocol.schema()
    xsd = httpx.get(f"{served.base}/api/v1/schemas/confirmation.xsd", timeout=10)
    assert xsd.status_code == 200 and xsd.text == CONFIRMATION_XSD
