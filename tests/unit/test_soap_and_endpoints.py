"""Declaring a SOAP route, reading OPENHUB_CONFIRM_ENDPOINTS, and the XML guards, without servers (issue 38)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from openhub import ConfigurationError, Route, Soap, step
from openhub.core.endpoints import parse_endpoints
from openhub.core.soapxml import MAX_DEPTH, XmlRefused, decode, parse, read_envelope, wsdl
from tests.support.routes import SOAP_XSD


@step
def nothing(ctx) -> None:
    """A step."""


def test_a_soap_route_is_checked_when_declared(tmp_path) -> None:
    route = Route("s.op", steps=[nothing], soap=Soap(xsd=SOAP_XSD, element="customer"))
    assert route.soap is not None and route.soap.element == "customer"
    path = tmp_path / "c.xsd"
    path.write_text(SOAP_XSD)
    assert Soap(xsd=str(path), element="customer").xsd == SOAP_XSD  # a file's text is read when declared
    with pytest.raises(ConfigurationError, match="no global element 'supplier'.*customer"):
        Soap(xsd=SOAP_XSD, element="supplier")
    with pytest.raises(ConfigurationError, match="not a valid self-contained schema"):
        Soap(xsd="<xs:schema xmlns:xs='http://www.w3.org/2001/XMLSchema'><xs:element/></xs:schema>", element="a")
    with pytest.raises(ConfigurationError, match="cannot read the XSD"):
        Soap(xsd=str(tmp_path / "missing.xsd"), element="customer")
    with pytest.raises(ConfigurationError, match="soap must be a Soap"):
        Route("s.op", steps=[nothing], soap="customer")


def test_hostile_xml_is_refused_while_parsed() -> None:
    for doc, what in (
        (b'<!DOCTYPE a [<!ENTITY e SYSTEM "file:///etc/passwd">]><a>&e;</a>', "DTDForbidden"),
        (b'<!DOCTYPE a SYSTEM "http://example.com/a.dtd"><a/>', "DTDForbidden"),
        (b"<a>" * (MAX_DEPTH + 1) + b"</a>" * (MAX_DEPTH + 1), "deeper than"),
        (b'<a b="' + b"x" * 70_000 + b'"/>', "attribute b"),
        (b"<a><b></a>", "not well-formed"),
    ):
        with pytest.raises(XmlRefused, match=what):
            parse(doc)
    with pytest.raises(XmlRefused, match="not a SOAP"):
        read_envelope(b"<a/>", "text/xml")


def test_the_body_is_validated_and_decoded_to_a_dict() -> None:
    ns = 'xmlns:c="urn:example:customers"'
    body = parse(
        f'<c:customer {ns} kind="vip"><c:id>1</c:id><c:name>Ada</c:name><c:credit>2.5</c:credit></c:customer>'.encode()
    )
    assert decode(SOAP_XSD, body) == {"kind": "vip", "id": "1", "name": "Ada", "credit": 2.5}
    with pytest.raises(XmlRefused, match="customer/credit: invalid value") as refused:
        decode(
            SOAP_XSD,
            parse(f"<c:customer {ns}><c:id>1</c:id><c:name>A</c:name><c:credit>x</c:credit></c:customer>".encode()),
        )
    assert refused.value.element == "credit" and refused.value.code == "VALIDATION"
    document = wsdl("s", [("op", SOAP_XSD, "customer")], "http://hub/soap/s")
    assert b'element="m0:customer"' in document and b'location="http://hub/soap/s"' in document


def test_confirm_endpoints_are_read_and_checked() -> None:
    short = parse_endpoints("CRM=https://crm.example/confirm, SHOP=http://shop/c")
    assert short["CRM"].url == "https://crm.example/confirm" and short["SHOP"].states == {"OK", "FAILED", "CANCEL"}
    full = parse_endpoints(
        '{"ERP": {"url": "https://erp/c", "format": "soap", "max_fails": "forever", '
        '"interval": 10, "backoff": 2, "max_interval": 30, "states": ["FAILED"]}}'
    )["ERP"]
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert full.forever and full.retry_at(1000, now, 3, timedelta(seconds=60)) == now + timedelta(seconds=30)
    assert full.retry_at(2, now, 3, timedelta(seconds=60)) == now + timedelta(seconds=20)
    steep = parse_endpoints('{"A": {"url": "https://a/c", "max_fails": "forever", "backoff": 1e10}}')["A"]
    assert steep.retry_at(10**6, now, 3, timedelta(seconds=60)) == now + timedelta(days=1)  # no overflow
    limited = parse_endpoints('{"A": {"url": "https://a/c", "max_fails": 2}}')["A"]
    assert limited.retry_at(1, now, 3, timedelta(seconds=60)) == now + timedelta(seconds=60)
    assert limited.retry_at(2, now, 3, timedelta(seconds=60)) is None
    for raw, error in (
        ("CRM", "SYSTEM=url"),
        ('{"A": {"url": "ftp://x"}}', "http"),
        ('{"A": {"url": "https://a", "format": "xml"}}', "format"),
        ('{"A": {"url": "https://a", "max_fails": 0}}', "max_fails"),
        ('{"A": {"url": "https://a", "states": ["DONE"]}}', "states"),
        ('{"A": {"url": "https://a", "tiemout": 3}}', "unknown key"),
        ("{", "not valid JSON"),
    ):
        with pytest.raises(ConfigurationError, match=error):
            parse_endpoints(raw)


def test_an_endpoint_needs_its_signing_secret(monkeypatch) -> None:
    from openhub.core.config import Settings

    env = {"OPENHUB_CONFIRM_ENDPOINTS": "CRM=https://crm/c"}
    with pytest.raises(ConfigurationError, match="no OPENHUB_CONFIRM_SECRETS secret"):
        Settings.from_env(env)
    env["OPENHUB_CONFIRM_SECRETS"] = "CRM=" + "s" * 40
    assert Settings.from_env(env).confirm_endpoints["CRM"].url == "https://crm/c"
    with pytest.raises(ConfigurationError, match="longer than OPENHUB_CONFIRM_TIMEOUT"):
        Settings.from_env({**env, "OPENHUB_CONFIRM_ENDPOINTS": '{"CRM": {"url": "https://c/c", "timeout": 99}}'})
