"""The gateway's call path, one concern per module; ``enforce.py`` composes them in this order
(docs/gateway.md lists what each refuses):

    doors (authentication: auth/doors.py; admission.py: the caller's rate limits; rest.py,
    mcp_server.py: body, argument schema)  ->  ownership.py (whose run,
    how many runs)  ->  the call plan (plan.py: the tool served, compiled once per served
    manifest)  ->  checks.py  ->  key.py (render, Idempotency-Key free)  ->  approval.py
    ->  keylocks.py (the key's lock)  ->  capture.py  ->  write_ahead.py  ->  outcome.py
    (the upstream call, the outcome's compare-and-set)  ->  after_call.py (the read after
    the call, recorded by a second compare-and-set)  ->  the report (outcome.py,
    refusals.py)

A refusal at any stage goes to refusals.py (recorded as a ``refused`` entry where it may
be); a dry run stops after the checks and the key (refusals.py). After the call, the doors
put its attributes on its trace (admission.py). Every stage but admission.py is a mixin of
``Gateway``; admission.py runs at the doors, before a caller's call reaches enforcement.
"""
