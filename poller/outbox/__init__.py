"""Writing to the outbox: enqueue to one endpoint, publish to every subscriber.

The doors (poller/outbox/doors.py) let any driver write inside the application's own
transaction; the checks (insert.py) and the SQL functions are one definition of a write.
"""
