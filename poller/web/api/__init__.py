"""The management API, ``/api/v1``: JSON in and out, for other services (routes.py says
what it is; rest.py is the ground its routes stand on; shapes.py and openapi.py describe it).
"""
