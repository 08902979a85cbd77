"""Astra as an MCP server (`astra mcp`): a coding agent calls list, extract, probe, check, bench, profile and patch
as tools and gets the same JSON verdicts the commands write. `tools` holds the library calls, `server` the MCP
wiring (the official Python SDK); docs/mcp.md says how to plug it into an agent."""
