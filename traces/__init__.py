"""Workloads: request streams from generators, prompt sets and real serving traces."""
