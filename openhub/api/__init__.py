"""The hub's HTTP face: ingress for source systems, operator endpoints, health, metrics, /admin.

`create_app()` in `app.py` assembles it; each router module is named after the noun it serves
(messages, routes, health). Every openhub error is turned into an HTTP status in one place,
`problems.py`.
"""
