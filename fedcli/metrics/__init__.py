"""Scores of classifiers on test sets, with bootstrap intervals, and FedPerl's adaptive calibration bins."""
