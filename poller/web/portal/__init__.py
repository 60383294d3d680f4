"""The tenant portal, ``/portal``: one tenant's people manage that tenant's endpoints and
see their deliveries (poller/access/portal.py makes the links and signs the sessions).
"""
