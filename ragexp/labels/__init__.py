"""People's labels in MLflow's review queues: queues of a run's traces, and calibration from the answers."""
