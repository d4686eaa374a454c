"""Calls out of the hub: HTTP steps, breakers and limits, confirmations and state hooks."""
