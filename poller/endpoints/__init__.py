"""Endpoints: named destinations, what they may be (URL, headers, TLS, subscriptions)
and their keys — and the guard on the addresses a delivery may reach.
"""
