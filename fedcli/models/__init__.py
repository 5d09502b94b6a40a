"""Classifiers the federated strategies train."""
