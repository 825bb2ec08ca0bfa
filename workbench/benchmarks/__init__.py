"""Runnable GPU benchmarks (``python -m workbench.benchmarks.<name>``); each prints a table and
ends with one JSON line. They exit 2 without CUDA rather than print numbers they did not measure."""
