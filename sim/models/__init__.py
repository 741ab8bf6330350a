"""The simulator's fitted models: what a step costs (latency, its choice, the engine's step
composition and fixed shapes) and what each row drafts and accepts (acceptance, replay). The
executor (`sim.executor`) prices and draws steps with them; they know nothing of the loop."""
