"""Data enters: a session's turns become topics (``extract``), each topic is decided against the
memories it resembles (ADD / MERGE / UPDATE / INVALIDATE / NOOP) and written into a store
(``apply``), with the prompts that step sends (``prompts``).
"""
