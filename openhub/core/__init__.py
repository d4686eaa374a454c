"""The pure floor: the routing model, states, verdicts, policy, settings and errors.

No Celery, SQLAlchemy or FastAPI here (tests/unit/test_layers.py)."""
