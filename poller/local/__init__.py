"""Servers for a laptop and the tests: embedded PostgreSQL and Redis, the reference receiver."""
