"""Tests of lbtune.metrics."""
