"""schemathesis hooks for scripts/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

Generated deal ids are short ("0", "00", ...): once the first phases have created those
deals, nearly every valid `POST /admin/deals` repeats an id (409), and the stateful phase
seldom gets the new deal its links start from. Each valid body's id gets a counter
appended, which keeps it within the document's pattern and length and makes it unique.
Bodies generated to be invalid are left alone, so they stay invalid.

A generated endpoint URL is nearly never one the gateway takes (http(s), an address that is
not inward), so the stateful phase would seldom get an endpoint to follow: each valid body's
URL becomes one on the discard port of loopback, which the gateway under test allows
(`events.allow_private_targets`), so deliveries stay on this machine.
"""

import itertools

import schemathesis
from schemathesis.core.parameters import ParameterLocation

DEAL_ID_CHARS_MAX = 64
_fresh = itertools.count(1)


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.path.startswith("/admin/event-endpoints"):
        _loopback_url(case)
        return
    if case.method.upper() != "POST" or case.path != "/admin/deals":
        return
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        return
    if case.meta is not None and case.meta.is_negative_at(ParameterLocation.BODY):
        return
    suffix = f"-{next(_fresh)}"
    body["id"] = body["id"][: DEAL_ID_CHARS_MAX - len(suffix)] + suffix


def _loopback_url(case):
    body = case.body
    if case.method.upper() not in ("POST", "PATCH") or not isinstance(body, dict):
        return
    if not isinstance(body.get("url"), str):
        return
    if case.meta is not None and case.meta.is_negative_at(ParameterLocation.BODY):
        return
    body["url"] = f"http://127.0.0.1:9/flashgate-{next(_fresh)}"
