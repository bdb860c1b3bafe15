"""agentloop: the asyncio AgentLoop runtime that drives inference servers through aprof."""
