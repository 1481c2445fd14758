"""One module per ``memkern`` command: ``configure(parser)`` and ``run(args) -> int``."""
