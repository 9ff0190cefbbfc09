"""The safety foundations every layer may use: bounded reads of regular files and output
paths checked up front (:mod:`~lbtune.safety.files`), children that die with lbtune
(:mod:`~lbtune.safety.lifeline`), secrets kept out of logs, reports and records
(:mod:`~lbtune.safety.secrets`)."""
