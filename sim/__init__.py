"""Discrete-event simulator of a continuous-batching serving engine with speculative decoding."""
