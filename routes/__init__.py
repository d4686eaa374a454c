"""Example routes served by `openhub dev` (OPENHUB_ROUTES defaults to this package)."""
