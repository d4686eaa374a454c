"""Carrying messages through their routes: the engine, leases, splits, funnels, waits and the poller."""
