"""decode-server: vLLM's token-in generate protocol with inline text and derender levels."""

__version__ = "0.1.0"
