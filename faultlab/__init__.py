"""faultlab: the command-line program and the engine loop, on top of executor, telemetry and chaos."""
