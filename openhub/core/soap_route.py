"""A route's SOAP ingress as declared (`Route(..., soap=Soap(xsd=..., element=...))`): checked when declared,
like the rest of the routing model (model.py), apart from it for its XSD handling; xmlschema itself is loaded
(core/soapxml.py) only by routes that take SOAP.
"""

from __future__ import annotations

from dataclasses import dataclass

from openhub.core.errors import ConfigurationError


@dataclass(frozen=True)
class Soap:
    """A route's SOAP ingress (openhub.api.soap): messages arrive as `element` of the XSD `xsd` in a SOAP
    1.1 or 1.2 body, validated and decoded against it; the steps see the decoded dict.

    `xsd` is the schema's text or the path of a self-contained .xsd file (no xs:import or xs:include of
    other files); `element` one of its global elements, by local name. Checked when declared.
    """

    xsd: str
    element: str

    def __post_init__(self) -> None:
        if not isinstance(self.element, str) or not self.element:
            raise ConfigurationError(f"Soap: element must be the local name of a global element, got {self.element!r}")
        text = self.xsd
        if not isinstance(text, str) or not text.strip():
            raise ConfigurationError("Soap: xsd must be the schema's text or the path of an .xsd file")
        if not text.lstrip().startswith("<"):
            try:
                with open(text, encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise ConfigurationError(f"Soap: cannot read the XSD {self.xsd!r}: {exc.strerror}") from None
        from openhub.core.soapxml import schema_element  # xmlschema is loaded only by routes that take SOAP

        schema_element(text, self.element)  # a ConfigurationError naming what is wrong
        object.__setattr__(self, "xsd", text)
