"""What operators do, behind `poller admin`, the dashboard and the API: look, retry,
replay, cancel, pause, count.
"""
