"""A generator kind outside fedcli: each class's mean training image, a tiny decoder. Its package is laid out as a
built-in kind's (kind.py declares KIND, options.py OPTIONS) and named by the distribution's fedcli.generators entry
point, so the registry discovers it as it discovers the built-in kinds."""
