"""The job model: pure data, no I/O beyond validating paths the user named."""
