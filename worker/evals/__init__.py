"""Evaluation sets: score answers against expected ones, summarise a results file, compare two, and
write a self-contained HTML report. Everything here but `cli_eval` is pure."""
