"""What every stage stands on: argument checks and bounds, the one durable file write, where files
live, tracing, turn identity and the version.
"""
