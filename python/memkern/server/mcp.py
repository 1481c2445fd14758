"""``memkern mcp``: the :class:`~memkern.server.service.MemoryService` operations as MCP tools, over stdio.

Tools (arguments as in the HTTP API, :mod:`memkern.server.app`): ``add_memory``,
``search_memories``, ``list_memories``, ``get_memory``, ``update_memory``, ``delete_memory``,
``memory_history``, ``respond``, ``feedback``. ``add_memory`` takes the conversation's ``date``;
``search_memories`` and ``respond`` take ``filters``, ``time_range``, ``time_field``, ``recency``,
``recency_weight`` and ``now`` (meaning as in the HTTP API). Every tool returns the same JSON object as the HTTP
route; a rejected argument is a tool error whose text names it (``user_id: expected ...``), and
nothing is written. Built with the ``mcp`` package (``pip install memkern[serve]``).
"""

from typing import Any, Optional, Union

import functools

from ..errors import MemkernError
from .service import MemoryService

INSTRUCTIONS = (
    "Long-term memory (memkern). Memories belong to a scope: user_id, agent_id and/or run_id (at least one; "
    "1-38 characters of A-Z a-z 0-9 _ - . @). add_memory stores a conversation (infer=true extracts topics and "
    "merges them with what is known; infer=false stores the messages as they are); search_memories finds the "
    "most relevant ones; respond answers a question from them with citations."
)

TOOL_NAMES = ("add_memory", "search_memories", "list_memories", "get_memory", "update_memory", "delete_memory",
              "memory_history", "respond", "feedback")


def build_server(service: MemoryService):
    """An MCP server exposing ``service`` (run it with ``.run()``: stdio)."""
    from mcp.server.mcpserver import MCPServer  # mcp >= 2
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("memkern", instructions=INSTRUCTIONS)

    def tool(fn):
        """Register ``fn``; a memkern error becomes a tool error carrying its message (the client
        sees ``user_id: expected ...``), anything else stays a crash (logged, generic message)."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except MemkernError as e:
                msg = e.args[0] if isinstance(e, KeyError) and len(e.args) == 1 else str(e)
                raise ToolError(f"{type(e).__name__}: {msg}") from None

        return server.tool()(wrapper)

    @tool
    def add_memory(messages: Union[str, list[dict[str, Any]]], user_id: Optional[str] = None,
                   agent_id: Optional[str] = None, run_id: Optional[str] = None,
                   metadata: Optional[dict[str, Any]] = None, infer: bool = True,
                   date: Optional[Union[float, str]] = None) -> dict:
        """Add a conversation (a list of {"role", "content"} messages, or one user message) to a scope's memory;
        date: when the conversation happened (unix seconds or a date string such as "2023-05-08")."""
        return service.add(messages, user_id=user_id, agent_id=agent_id, run_id=run_id, metadata=metadata,
                           infer=infer, date=date)

    @tool
    def search_memories(query: str, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                        run_id: Optional[str] = None, limit: int = 10,
                        filters: Optional[dict[str, Any]] = None,
                        time_range: Optional[list[Optional[Union[float, str]]]] = None, time_field: str = "event",
                        recency: Optional[float] = None, recency_weight: float = 0.1,
                        now: Optional[float] = None) -> dict:
        """The memories most relevant to query, in every scope containing the given ids, best first.
        filters: {"key": value} or {"key": {"$in": [values]}} on metadata; time_range: [start, end) as dates or
        unix seconds (null: open); time_field: "event" (conversation date), "created" or "updated"; recency:
        half-life in seconds of a recency prior of weight recency_weight, measured from now."""
        return service.search(query, user_id=user_id, agent_id=agent_id, run_id=run_id, limit=limit, filters=filters,
                              time_range=time_range, time_field=time_field, recency=recency,
                              recency_weight=recency_weight, now=now)

    @tool
    def list_memories(user_id: Optional[str] = None, agent_id: Optional[str] = None, run_id: Optional[str] = None,
                      limit: int = 100) -> dict:
        """Every memory of the scopes containing the given ids."""
        return service.list(user_id=user_id, agent_id=agent_id, run_id=run_id, limit=limit)

    @tool
    def get_memory(memory_id: int) -> dict:
        """One memory by id."""
        return service.get(memory_id)

    @tool
    def update_memory(memory_id: int, text: Optional[str] = None, metadata: Optional[dict[str, Any]] = None) -> dict:
        """Replace a memory's text and/or metadata (a new version; the old one stays in its history)."""
        return service.update(memory_id, text=text, metadata=metadata)

    @tool
    def delete_memory(memory_id: int) -> dict:
        """Delete a memory."""
        return service.delete(memory_id)

    @tool
    def memory_history(memory_id: int) -> dict:
        """Every version of a memory, oldest first."""
        return service.history(memory_id)

    @tool
    def respond(query: str, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                run_id: Optional[str] = None, filters: Optional[dict[str, Any]] = None,
                time_range: Optional[list[Optional[Union[float, str]]]] = None, time_field: str = "event",
                recency: Optional[float] = None, recency_weight: float = 0.1, now: Optional[float] = None) -> dict:
        """Answer query from the scope's memories (RMM: retrieve, rerank, answer with citations); filters and
        time arguments as in search_memories limit the memories it may use."""
        return service.respond(query, user_id=user_id, agent_id=agent_id, run_id=run_id, filters=filters,
                               time_range=time_range, time_field=time_field, recency=recency,
                               recency_weight=recency_weight, now=now)

    @tool
    def feedback(response_id: str, rewards: list[float]) -> dict:
        """Rewards in [-1, 1] for the memories an earlier respond showed (in order): trains the reranker."""
        return service.feedback(response_id, rewards)

    return server
