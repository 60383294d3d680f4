"""Delivering a claimed message: one task a message, one attempt at a time, through
the one sender seam (wire.py) and the HTTP client the settings choose.
"""
