"""Claiming: when and how much this poller claims, and of which shards."""
