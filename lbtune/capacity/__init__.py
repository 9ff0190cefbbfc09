"""Capacity at SLO: the highest offered rate at which the SLO holds for a given share of
requests, with a CI (``lbtune capacity``).

* :mod:`~lbtune.capacity.fit` — the monotone attainment curve, the capacity where it crosses
  the target, its bootstrap CI, cliffs (pure);
* :mod:`~lbtune.capacity.search` — bracket, bisect, stop at the precision asked (pure; a
  probe is any function of the rate);

See ``docs/capacity.md``.
"""
