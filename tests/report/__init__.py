"""Tests of lbtune.report."""
