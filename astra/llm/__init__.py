"""Talking to a model: an OpenAI-compatible client with retries and budgets (`client`), its token and cost
accounting and transcript (`usage`), and the prompt templates (`templates`, data files `prompts/*.md`).
Used by the optimize loop's LLM agent and by spec drafting (astra.spec.llm_draft); it imports neither."""
