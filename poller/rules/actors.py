"""Who made a change: the actor recorded with it, and what a tenant sees of it.

A change records its actor — in ``paused.by``, a disabled endpoint's reason
("disabled by …"), a cancelled message's last error ("cancelled by …"), a test
event's ``sent_by`` — so an operator can tell who did what. The forms:

* ``admin:USER@HOST`` — the CLI (:func:`poller.operate.admin.actor`);
* ``dashboard:USER@ADDRESS`` — the operator's dashboard;
* ``api:…`` — through the management API, followed by its caller: ``dashboard:USER``
  (the operator's credentials), ``token:NAME`` (an admin's token) or
  ``tenant:TENANT/token:NAME`` (a tenant's token);
* ``tenant:TENANT/portal@ADDRESS`` — the tenant portal.

An operator's identity is not a tenant's to see (a user name, a host, an address):
a tenant's views show it as ``operator`` (:func:`seen_by`), and its own actions as
recorded. A test event an operator sends to a tenant's endpoint says ``operator``
to the receiver, too.
"""

from __future__ import annotations

import re

OPERATOR = "operator"
_ACTOR = re.compile(r"(?:api:)?(?:dashboard|admin|token|portal|tenant):[^\s,;()\"']+")


def of_tenant(tenant: str, what: str) -> str:
    """The actor a tenant's own caller records: ``tenant:TENANT/`` and ``what``."""
    return f"tenant:{tenant}/{what}"


def seen_by(text: str | None, tenant: str | None) -> str | None:
    """``text`` as ``tenant`` may see it: every actor in it that is not the tenant's
    own is ``operator``; ``tenant`` None (an operator's view) sees it all."""
    if text is None or tenant is None:
        return text
    own = (of_tenant(tenant, ""), "api:" + of_tenant(tenant, ""))

    def shown(found: re.Match[str]) -> str:
        return found.group(0) if found.group(0).startswith(own) else OPERATOR

    return _ACTOR.sub(shown, text)
