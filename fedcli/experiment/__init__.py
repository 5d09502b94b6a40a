"""The experiment folder and what is written in it: configs and their options, paths, artifacts and their checks, locks,
events, figures."""
