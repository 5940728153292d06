"""Fixtures for the http backend (session-scoped servers on loopback)."""
