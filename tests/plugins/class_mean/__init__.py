"""A generator kind outside fedcli: each class's mean training image, a tiny decoder. It is one sub-package
(kind.py declares KIND); tests/test_generator_kinds.py puts its folder on fedcli.generators' path, and the
registry discovers it as it discovers the built-in kinds."""
