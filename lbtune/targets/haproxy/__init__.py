"""The HAProxy target: runtime API client (:mod:`lbtune.targets.haproxy.runtime`)."""
