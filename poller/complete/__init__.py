"""Completing: outcomes written in batches, and the claims of rows still at work kept."""
