"""HAProxy as an lbtune target: everything lbtune knows about HAProxy lives here.

* :mod:`~lbtune.targets.haproxy.balancer` — the registry entry: the embedded cluster's
  launch, health and scrape job, the live weights (the agent's actuator).
* :mod:`~lbtune.targets.haproxy.target` — :class:`HaproxyTarget`: space, validate, apply
  (runtime API or validated hitless reload), read-back, rollback.
* :mod:`~lbtune.targets.haproxy.config` — knobs → ``haproxy.cfg.j2`` variables; live vs
  structural.
* :mod:`~lbtune.targets.haproxy.files` — the state dir's HAProxy files, the site, ``haproxy -c``.
* :mod:`~lbtune.targets.haproxy.runtime` — the one runtime-API client and ``show stat`` parser.
* :mod:`~lbtune.targets.haproxy.master` — the master CLI: reload, worker identity.
* :mod:`~lbtune.targets.haproxy.llm` — the LLM-aware Lua scheduler (``algorithm: llm``).
* :mod:`~lbtune.targets.haproxy.agent_check` — an end-to-end check of the feedback agent.
"""
