"""The operator's dashboard: a second face on ``poller admin``.

Every page reads through the functions the CLI uses (poller/operate/admin.py,
poller/rows/ordering.py, poller/claim/shards.py) and every action calls the CLI's
functions, recording who acted (``dashboard:<who>@<address>``). Endpoints are shown
from ``admin.health_report`` and the endpoint list, without their secrets.
"""
