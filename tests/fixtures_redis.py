"""Fixtures for the redis backend (session-scoped servers on loopback)."""
