"""Drop-in glue for the agent loops people already run (asyncio, LangGraph, OpenAI Agents SDK, MCP); each module imports its framework lazily."""
