"""Tests of the command line (jaxpod.cli)."""
