"""Reading text without a model: the turn template, time expressions, first-person slot statements and
the JSON that models emit.
"""
