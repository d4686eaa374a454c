"""What the drivers (HTTP API, command line, Python API) call: accepting and reading messages, operator
actions and read models."""
