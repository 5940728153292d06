"""Fixtures for the s3 backend (session-scoped servers on loopback)."""
