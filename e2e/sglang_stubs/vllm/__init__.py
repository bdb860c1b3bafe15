"""Import-only stand-in for vLLM in the SGLang end-to-end environment (``nox -s e2e_sglang``).

On ``--device cpu`` SGLang 0.5.23's rotary embedding imports
``vllm._custom_ops.rotary_embedding`` but calls it only on the CUDA path. This folder's parent
goes on the SGLang server's ``PYTHONPATH`` only; it is no vLLM.
"""
