"""Tables and figures built from artifacts."""
