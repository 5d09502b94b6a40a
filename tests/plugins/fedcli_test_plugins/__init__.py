"""A plugin distribution as a user would write one (its metadata beside it, fedcli_test_plugins-0.1.dist-info):
conftest.py puts this folder on the path of every test and of every process a test starts."""
