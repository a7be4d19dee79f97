"""schemathesis hooks for scripts/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

Generated deal ids are short ("0", "00", ...): once the first phases have created those
deals, nearly every valid `POST /admin/deals` repeats an id (409), and the stateful phase
seldom gets the new deal its links start from. Each valid body's id gets a counter
appended, which keeps it within the document's pattern and length and makes it unique.
Bodies generated to be invalid are left alone, so they stay invalid.
"""

import itertools

import schemathesis
from schemathesis.core.parameters import ParameterLocation

DEAL_ID_CHARS_MAX = 64
_fresh = itertools.count(1)


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.method.upper() != "POST" or case.path != "/admin/deals":
        return
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        return
    if case.meta is not None and case.meta.is_negative_at(ParameterLocation.BODY):
        return
    suffix = f"-{next(_fresh)}"
    body["id"] = body["id"][: DEAL_ID_CHARS_MAX - len(suffix)] + suffix
