"""The app layer: the ``securefed`` command line, experiment runners, tables and plots."""
