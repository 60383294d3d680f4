"""The poller service (`poller run`): assembled, supervised, one or several processes,
its housekeeping loops and its operations endpoints.
"""
