"""nginx (open source) as an lbtune target: config rendering, graceful reloads, read-back."""
