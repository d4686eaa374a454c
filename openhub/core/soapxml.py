"""SOAP's XML: reading an envelope safely, checking and decoding its body against a route's XSD, and
writing WSDLs, accept responses, faults and the SOAP variant of a confirmation.

Hostile XML is refused while it is parsed, before any of it is acted on: defusedxml's expat parser
stops at a DOCTYPE (so no entity is declared, expanded or fetched: no XXE, no billion laughs, no
external DTD) and the tree builder stops at the first element deeper than MAX_DEPTH or the first
attribute longer than MAX_ATTRIBUTE_CHARS. The body's size was limited before (the JSON API's
OPENHUB_MAX_PAYLOAD_BYTES). `xmlschema` validates and decodes the body element; `lxml` writes XML.
This module imports no FastAPI, Celery or SQLAlchemy.
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Iterable

import defusedxml.ElementTree as SafeET
import xmlschema
from defusedxml import DefusedXmlException
from lxml import etree

from openhub.core.errors import ConfigurationError

SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
WSA = "http://www.w3.org/2005/08/addressing"
HUB = "urn:openhub:soap:1"  # the hub's own elements: AcceptResponse, a fault's detail, ProcessId
CONFIRMATION = "urn:openhub:confirmation:1"  # the SOAP variant of the confirmation protocol
XS = "http://www.w3.org/2001/XMLSchema"
WSDL = "http://schemas.xmlsoap.org/wsdl/"
WSDL_SOAP11 = "http://schemas.xmlsoap.org/wsdl/soap/"
WSDL_SOAP12 = "http://schemas.xmlsoap.org/wsdl/soap12/"
MAX_DEPTH = 32  # elements nested deeper than this (the Envelope is depth 1) are refused
MAX_ATTRIBUTE_CHARS = 65_536
MEDIA = {11: "text/xml", 12: "application/soap+xml"}


class XmlRefused(Exception):
    """Why a SOAP request is refused: a fault's reason, the element it concerns, its code and HTTP status."""

    def __init__(
        self,
        reason: str,
        code: str,
        element: str | None = None,
        status: int = 400,
        headers: dict[str, str] | None = None,
        message_id: int | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason, self.code, self.element, self.status = reason, code, element, status
        self.headers, self.message_id = headers or {}, message_id


def local(tag: str) -> str:
    """An element's name without its namespace."""
    return tag.rsplit("}", 1)[-1]


def _path(path: str | None) -> str | None:
    return None if path is None else "/".join(local(part) for part in path.split("/"))


class _Guarded(ET.TreeBuilder):
    """A tree builder that stops at the first element too deep or attribute too long."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0

    def start(self, tag: Any, attrs: dict[Any, Any]) -> ET.Element:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise XmlRefused(
                f"element {local(tag)} is nested {self.depth} deep, deeper than the {MAX_DEPTH} allowed",
                "HOSTILE_XML",
                local(tag),
            )
        for name, value in attrs.items():
            if len(value) > MAX_ATTRIBUTE_CHARS:
                raise XmlRefused(
                    f"attribute {local(name)} of element {local(tag)} has {len(value)} characters, "
                    f"more than the {MAX_ATTRIBUTE_CHARS} allowed",
                    "HOSTILE_XML",
                    local(tag),
                )
        return super().start(tag, attrs)

    def end(self, tag: Any) -> ET.Element:
        self.depth -= 1
        return super().end(tag)


def parse(data: bytes) -> ET.Element:
    """The document's root element; XmlRefused for malformed or hostile XML (module doc)."""
    parser = SafeET.DefusedXMLParser(target=_Guarded(), forbid_dtd=True, forbid_entities=True, forbid_external=True)
    try:
        parser.feed(data)
        return parser.close()  # type: ignore[no-any-return]
    except DefusedXmlException as exc:
        raise XmlRefused(
            f"the document is refused: {type(exc).__name__} (no DTD, entity or external reference is taken)",
            "HOSTILE_XML",
        ) from None
    except ET.ParseError as exc:
        raise XmlRefused(f"the body is not well-formed XML: {exc}", "MALFORMED_XML") from None


@dataclass(frozen=True)
class Envelope:
    """A parsed SOAP request: its version (11 or 12), the body's element and the ids its headers carry."""

    version: int
    body: ET.Element
    message_id: str | None  # wsa:MessageID
    relates_to: str | None  # wsa:RelatesTo
    process_id: str | None  # hub:ProcessId


def version_of(content_type: str | None) -> int:
    """The SOAP version a Content-Type says (for a fault when the envelope cannot be read): 12 or 11."""
    return 12 if (content_type or "").lower().startswith("application/soap+xml") else 11


def read_envelope(data: bytes, content_type: str | None) -> Envelope:
    """The envelope of a SOAP request; XmlRefused when it is not one with exactly one body element."""
    root = parse(data)
    version = {f"{{{SOAP11}}}Envelope": 11, f"{{{SOAP12}}}Envelope": 12}.get(root.tag)
    if version is None:
        raise XmlRefused(
            f"the document is {local(root.tag)}, not a SOAP 1.1 or 1.2 Envelope", "NOT_SOAP", local(root.tag)
        )
    ns = SOAP11 if version == 11 else SOAP12
    body = root.find(f"{{{ns}}}Body")
    children = list(body) if body is not None else []
    if len(children) != 1:
        raise XmlRefused(f"the SOAP Body must hold exactly one element, it holds {len(children)}", "NOT_SOAP", "Body")
    header = root.find(f"{{{ns}}}Header")

    def text(tag: str) -> str | None:
        found = header.find(tag) if header is not None else None
        value = (found.text or "").strip() if found is not None else ""
        return value or None

    return Envelope(
        version, children[0], text(f"{{{WSA}}}MessageID"), text(f"{{{WSA}}}RelatesTo"), text(f"{{{HUB}}}ProcessId")
    )


@functools.lru_cache(maxsize=64)
def compile_schema(xsd: str) -> xmlschema.XMLSchema:
    """The XSD's compiled schema (once per text); ConfigurationError when it is no valid XSD. It may load
    nothing else (no xs:import or xs:include of other files)."""
    try:
        return xmlschema.XMLSchema(xsd, allow="none", defuse="always")
    except (xmlschema.XMLSchemaException, ET.ParseError, OSError, ValueError) as exc:
        raise ConfigurationError(f"Soap: the XSD is not a valid self-contained schema: {exc}") from None


def schema_element(xsd: str, element: str) -> str:
    """The `{namespace}name` of global element `element` of the XSD; ConfigurationError when it has none."""
    schema = compile_schema(xsd)
    qname = f"{{{schema.target_namespace}}}{element}" if schema.target_namespace else element
    if schema.maps.elements.get(qname) is None:
        names = ", ".join(sorted(local(e) for e in schema.elements)) or "none"
        raise ConfigurationError(f"Soap: the XSD has no global element {element!r} (it has {names})")
    return qname


def decode(xsd: str, body: ET.Element) -> dict[str, Any]:
    """The body element validated against the XSD and decoded: a dict of its attributes and child elements
    by local name (decimals as floats, repeated elements as lists). XmlRefused naming the first invalid
    element and why."""
    schema = compile_schema(xsd)
    for error in schema.iter_errors(body):
        where = _path(error.path) or local(body.tag)
        raise XmlRefused(
            f"{where}: {error.reason or error.message}",
            "VALIDATION",
            local(error.elem.tag) if error.elem is not None else local(body.tag),
        )
    value = schema.decode(body, strip_namespaces=True, decimal_type=float, attr_prefix="", cdata_prefix="#")
    return value if isinstance(value, dict) else {"value": value}


def _q(ns: str, name: str) -> str:
    return f"{{{ns}}}{name}"


def _bytes(root: etree._Element) -> bytes:
    return etree.tostring(root, xml_declaration=True, encoding="utf-8")


def _envelope(version: int) -> tuple[etree._Element, etree._Element]:
    ns = SOAP11 if version == 11 else SOAP12
    env = etree.Element(_q(ns, "Envelope"), nsmap={"soap": ns, "hub": HUB})
    return env, etree.SubElement(env, _q(ns, "Body"))


def accept_response(version: int, message_id: int, correlation_id: str, route: str, state: str) -> bytes:
    """The typed answer to an accepted message: hub:AcceptResponse (WSDL `AcceptResponse`)."""
    env, body = _envelope(version)
    answer = etree.SubElement(body, _q(HUB, "AcceptResponse"))
    for name, value in (
        ("messageId", message_id),
        ("correlationId", correlation_id),
        ("route", route),
        ("state", state),
    ):
        etree.SubElement(answer, _q(HUB, name)).text = str(value)
    return _bytes(env)


def fault(version: int, refused: XmlRefused) -> bytes:
    """A SOAP fault: Client/Sender for the caller's mistakes (status < 500), else Server/Receiver; its detail
    a hub:error with the code, the element (when one is concerned) and, for a duplicate, the first message."""
    env, body = _envelope(version)
    ns = SOAP11 if version == 11 else SOAP12
    sender = refused.status < 500
    node = etree.SubElement(body, _q(ns, "Fault"))
    if version == 11:
        etree.SubElement(node, "faultcode").text = "soap:Client" if sender else "soap:Server"
        etree.SubElement(node, "faultstring").text = refused.reason
        detail = etree.SubElement(node, "detail")
    else:
        code = etree.SubElement(node, _q(ns, "Code"))
        etree.SubElement(code, _q(ns, "Value")).text = "soap:Sender" if sender else "soap:Receiver"
        reason = etree.SubElement(node, _q(ns, "Reason"))
        text = etree.SubElement(reason, _q(ns, "Text"))
        text.set("{http://www.w3.org/XML/1998/namespace}lang", "en")
        text.text = refused.reason
        detail = etree.SubElement(node, _q(ns, "Detail"))
    error = etree.SubElement(detail, _q(HUB, "error"))
    etree.SubElement(error, _q(HUB, "code")).text = refused.code
    etree.SubElement(error, _q(HUB, "status")).text = str(refused.status)
    if refused.element:
        etree.SubElement(error, _q(HUB, "element")).text = refused.element
    if refused.message_id is not None:
        etree.SubElement(error, _q(HUB, "messageId")).text = str(refused.message_id)
    return _bytes(env)


ACCEPT_XSD = f"""<xs:schema xmlns:xs="{XS}" targetNamespace="{HUB}" elementFormDefault="qualified">
  <xs:element name="AcceptResponse"><xs:complexType><xs:sequence>
    <xs:element name="messageId" type="xs:long"/><xs:element name="correlationId" type="xs:string"/>
    <xs:element name="route" type="xs:string"/><xs:element name="state" type="xs:string"/>
  </xs:sequence></xs:complexType></xs:element>
  <xs:element name="ProcessId" type="xs:string"/>
</xs:schema>"""


def wsdl(service: str, operations: Iterable[tuple[str, str, str]], location: str) -> bytes:
    """The WSDL 1.1 of `service` (document/literal, SOAP 1.1 and 1.2 ports at `location`): one operation per
    (operation, xsd, element) of its SOAP routes, taking that element and answering hub:AcceptResponse."""
    tns = f"urn:openhub:soap:service:{service}"
    operations = list(operations)
    prefixes: dict[str, str] = {}  # a namespace of the routes' XSDs -> its prefix here
    for _, xsd, _ in operations:
        ns = compile_schema(xsd).target_namespace
        if ns:
            prefixes.setdefault(ns, f"m{len(prefixes)}")
    root = etree.Element(
        _q(WSDL, "definitions"),
        name=service,
        targetNamespace=tns,
        nsmap={
            "wsdl": WSDL,
            "soap": WSDL_SOAP11,
            "soap12": WSDL_SOAP12,
            "xs": XS,
            "tns": tns,
            "hub": HUB,
            **{p: ns for ns, p in prefixes.items()},
        },
    )
    types = etree.SubElement(root, _q(WSDL, "types"))
    types.append(etree.fromstring(ACCEPT_XSD))
    for xsd in dict.fromkeys(xsd for _, xsd, _ in operations):
        types.append(etree.fromstring(xsd.encode(), etree.XMLParser(resolve_entities=False, no_network=True)))
    parts = []
    for operation, xsd, element in operations:
        ns = compile_schema(xsd).target_namespace
        message = etree.SubElement(root, _q(WSDL, "message"), name=f"{operation}Request")
        etree.SubElement(message, _q(WSDL, "part"), name="body", element=f"{prefixes[ns]}:{element}" if ns else element)
        parts.append(operation)
    response = etree.SubElement(root, _q(WSDL, "message"), name="AcceptResponse")
    etree.SubElement(response, _q(WSDL, "part"), name="body", element="hub:AcceptResponse")
    port_type = etree.SubElement(root, _q(WSDL, "portType"), name=f"{service}PortType")
    for operation in parts:
        op = etree.SubElement(port_type, _q(WSDL, "operation"), name=operation)
        etree.SubElement(op, _q(WSDL, "input"), message=f"tns:{operation}Request")
        etree.SubElement(op, _q(WSDL, "output"), message="tns:AcceptResponse")
    for soap_ns, suffix in ((WSDL_SOAP11, ""), (WSDL_SOAP12, "12")):
        binding = etree.SubElement(
            root, _q(WSDL, "binding"), name=f"{service}Binding{suffix}", type=f"tns:{service}PortType"
        )
        etree.SubElement(
            binding, _q(soap_ns, "binding"), style="document", transport="http://schemas.xmlsoap.org/soap/http"
        )
        for operation in parts:
            op = etree.SubElement(binding, _q(WSDL, "operation"), name=operation)
            etree.SubElement(
                op, _q(soap_ns, "operation"), soapAction=f"urn:openhub:{service}.{operation}", style="document"
            )
            for io in ("input", "output"):
                etree.SubElement(etree.SubElement(op, _q(WSDL, io)), _q(soap_ns, "body"), use="literal")
    svc = etree.SubElement(root, _q(WSDL, "service"), name=service)
    for soap_ns, suffix in ((WSDL_SOAP11, ""), (WSDL_SOAP12, "12")):
        port = etree.SubElement(
            svc, _q(WSDL, "port"), name=f"{service}Port{suffix}", binding=f"tns:{service}Binding{suffix}"
        )
        etree.SubElement(port, _q(soap_ns, "address"), location=location)
    return _bytes(root)


CONFIRMATION_XSD = f"""<xs:schema xmlns:xs="{XS}" targetNamespace="{CONFIRMATION}" elementFormDefault="qualified">
  <xs:element name="confirmation"><xs:complexType><xs:sequence>
    <xs:element name="protocol" type="xs:string"/>
    <xs:element name="id" type="xs:long"/>
    <xs:element name="correlationId" type="xs:string"/>
    <xs:element name="sourceSystem" type="xs:string"/>
    <xs:element name="route" type="xs:string"/>
    <xs:element name="processId" type="xs:string" minOccurs="0"/>
    <xs:element name="state"><xs:simpleType><xs:restriction base="xs:string">
      <xs:enumeration value="OK"/><xs:enumeration value="FAILED"/><xs:enumeration value="CANCEL"/>
    </xs:restriction></xs:simpleType></xs:element>
    <xs:element name="errorCode" type="xs:string" minOccurs="0"/>
    <xs:element name="failedError" type="xs:string" minOccurs="0"/>
    <xs:element name="businessError" type="xs:string" minOccurs="0" maxOccurs="unbounded"/>
    <xs:element name="deliveryId" type="xs:string"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"""

_SOAP_FIELDS = (
    ("protocol", "protocol"),
    ("id", "id"),
    ("correlationId", "correlation_id"),
    ("sourceSystem", "source_system"),
    ("route", "route"),
    ("processId", "process_id"),
    ("state", "state"),
    ("errorCode", "error_code"),
    ("failedError", "failed_error"),
)


def confirmation_envelope(confirmation: dict[str, Any]) -> bytes:
    """The SOAP 1.1 variant of a confirmation (`CONFIRMATION_XSD`'s conf:confirmation) of the JSON one."""
    env = etree.Element(_q(SOAP11, "Envelope"), nsmap={"soap": SOAP11, "conf": CONFIRMATION})
    node = etree.SubElement(etree.SubElement(env, _q(SOAP11, "Body")), _q(CONFIRMATION, "confirmation"))
    for tag, key in _SOAP_FIELDS:
        if confirmation.get(key) is not None:
            etree.SubElement(node, _q(CONFIRMATION, tag)).text = str(confirmation[key])
    for error in confirmation.get("business_errors") or []:
        etree.SubElement(node, _q(CONFIRMATION, "businessError")).text = str(error)
    etree.SubElement(node, _q(CONFIRMATION, "deliveryId")).text = str(confirmation["delivery_id"])
    return _bytes(env)
