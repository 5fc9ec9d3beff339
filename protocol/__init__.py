"""Wire types of decode-server: msgspec Structs only, importable without vLLM."""
