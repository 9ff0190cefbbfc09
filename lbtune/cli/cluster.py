"""`lbtune cluster up|down|status` — the embedded default target (placeholder)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Run the embedded default cluster: simulated replicas, HAProxy, Prometheus.",
                  no_args_is_help=True)
