"""Real speculative-decoding engine on torch, its profiler, and vLLM format interop.

Importing this package imports no torch; its torch modules are imported where used.
"""
