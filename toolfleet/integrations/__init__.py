"""Glue for the agent loops people already run: asyncio, LangGraph, OpenAI Agents SDK, MCP."""
