"""responses-gateway: an exact OpenAI Responses API server in front of any model."""

__version__ = "0.1.0"
