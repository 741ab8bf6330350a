"""Helpers every layer uses: the input-error type and checks, atomic output, reading user files.

Nothing here knows about policies, the simulator or the backend.
"""
