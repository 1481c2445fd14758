"""The project's own prompts, one module per method (``rmm``, ``memreread``).

Each prompt comes with a short note saying what it must make the model do, and a builder that
returns chat messages (``list[dict]`` with ``role`` / ``content``) for :class:`memkern.ChatModel`.
"""
