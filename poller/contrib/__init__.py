"""Adapters for frameworks: each joins the framework's own transaction (``django``)."""
