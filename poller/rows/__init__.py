"""Row state, which carries the at-least-once contract: the fenced claim, heartbeat,
completion and reclaim writes (claims.py, completions.py), what an attempt tells its
endpoint's health (judging.py), ordered keys' hand-over and the operational events.

The loops above drive them: poller/claim (when to claim), poller/deliver (one task
a message), poller/complete (writing outcomes in batches).
"""
