"""A plain Locust file using lbtune's LLM user (for people who drive Locust themselves).

    locust -f examples/locustfile.py --headless -u 8 -r 8 -t 30s \
        --host http://127.0.0.1:8000 --lbtune-scenario chat --lbtune-records-dir out/

Every request is recorded exactly (TTFT from the first non-empty content chunk, every
chunk time, outcome, replica) in out/records-*.jsonl; Locust's own stats and web UI work
as usual. `lbtune stress` does the same with load shapes, open loop and a report.
"""

from lbtune.loadgen.user import LLMUser  # noqa: F401  (Locust picks the user class up)
