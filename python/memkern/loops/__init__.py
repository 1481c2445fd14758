"""The loops that use memory: RMM (reflect, retrieve, respond, learn) and MemReread."""
