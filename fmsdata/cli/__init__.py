"""The ``fmsdata`` command line: one module per subcommand."""
