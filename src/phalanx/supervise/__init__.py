"""A job's life: attempts, retries, stop and grace, watchdog, outcome, data, liveness.

The only caller of node handles and the only writer of a running job's state. Modules:
``submit`` (checks, plan with facts, record), ``job`` (``JobRun``, ``supervise``), ``attempt``
(one attempt's nodes), ``watch`` (metrics, samplers, stall clock), ``outcome`` (results ->
outcome, root cause), ``retry`` (policy), ``data`` (inputs, state, outputs), ``history``
(attempts.jsonl), ``liveness`` (who supervises, LOST), ``leftover`` (attempts that outlived
their supervisor), ``detached`` (supervisors in their own session), ``endings`` (what follows an
attempt's, a job's or a sweep's end: usage, metric summary, notifications), ``notify`` (the
``--notify`` targets and sending).
"""
