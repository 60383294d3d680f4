"""Rules and records every room stands on: pure functions and values, no I/O.

Names, payloads, what people type (parse), outcomes, the retry schedule, trace
context, the health policy, signing and sealing keys, actors. Nothing here imports
anything of ours but poller/errors.py and poller/redact.py (checked by `make lint`).
"""
