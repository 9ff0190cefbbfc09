"""lbtune: load-test LLM inference clusters and tune their load balancer.

Importing this package has no side effects: the heavy and patching dependencies
(locust/gevent, optuna, pandas, ansible-runner) are imported lazily by the leaf
modules that need them.
"""

__version__ = "0.1.0"
