"""The virtual-time twin: one run of a plan against the embedded cluster, simulated.

The scenario's requests, sent as the live generator would send them; one simulated engine
per replica (:mod:`lbtune.sim`'s, stepped in virtual time, no sockets, no sleeping); the
balancer's routing model (each balancer's own, in its target subpackage, behind
:class:`~lbtune.twin.routing.RoutingModel`). A twin run leaves the request records a live
run would, so the same metrics, censoring and objective read it.

* :mod:`~lbtune.twin.routing` — the protocol a balancer's routing model implements;
* :mod:`~lbtune.twin.run` — :func:`simulate`, the event loop;
* :mod:`~lbtune.twin.load` — when clients send (the live generator's rules);
* :mod:`~lbtune.twin.replica` — one replica's engine in virtual time;
* :mod:`~lbtune.twin.requests` — the requests, built once and shared by trials;
* :mod:`~lbtune.twin.flight` — a request in flight and its record;
* :mod:`~lbtune.twin.result` — :class:`TwinRun`, its summary and censored samples;
* :mod:`~lbtune.twin.pool` — independent virtual trials on several cores.

See ``docs/twin.md`` for what is modeled, what is not, and how close it comes.
"""
