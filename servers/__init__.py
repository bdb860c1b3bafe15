"""servers: inference-server capture targets (vLLM, SGLang) and the embedded reference server."""
