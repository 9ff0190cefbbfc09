"""Load generation: Locust users with exact streaming timing, records and health.

Layout (the data flows top to bottom):

* :mod:`~lbtune.loadgen.wire` — HTTP/1.1 + SSE bytes (pure, tested with byte streams);
* :mod:`~lbtune.loadgen.client` — the gevent socket client (one record per request);
* :mod:`~lbtune.loadgen.response` / :mod:`~lbtune.loadgen.kerneltime` — one exchange on a
  connection, and the kernel's receive time stamps of its bytes;
* :mod:`~lbtune.loadgen.sessions` — agent sessions: each call sent when the calls it
  waits for have ended plus its tool delay;
* :mod:`~lbtune.loadgen.user` — Locust ``LLMUser``, ``AgentUser``, open-loop dispatcher,
  load shape;
* :mod:`~lbtune.loadgen.worker` — the Locust process (local, master or worker), which
  reads :mod:`~lbtune.loadgen.settings` (its typed settings file) and, through
  :mod:`~lbtune.loadgen.source`, the run's recorded plan;
* :mod:`~lbtune.records.requests` / :mod:`~lbtune.loadgen.recordio` — records, JSONL, Parquet;
* :mod:`~lbtune.loadgen.health` — generator self-health;
* :mod:`~lbtune.loadgen.exporter` — client-side Prometheus ``/metrics``;
* :mod:`~lbtune.loadgen.collect` / :mod:`~lbtune.loadgen.runner` — ``run_load``, the
  library API (never imports Locust or gevent in the caller), supervising the processes
  of :mod:`~lbtune.loadgen.children`.

Importing this package imports nothing heavy.
"""
