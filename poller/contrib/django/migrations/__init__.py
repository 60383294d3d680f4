"""The Django app's migrations: each runs the poller's Alembic scripts to a revision."""
