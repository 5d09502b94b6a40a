"""The federate stage: its config, the engine and evaluator, checkpoints, both engines' runs, and the strategies."""
